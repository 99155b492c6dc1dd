//! The quota policies as the engine evaluates them: each stored policy parsed once, by workspace,
//! and which of them apply to a caller (DESIGN.md §4).

use std::collections::HashMap;

use rustc_hash::FxHashMap;

use super::window::Window;
use super::{Metric, Mode, SubjectKind};
use crate::kernel::caller::Caller;
use crate::store::{LabelStore, PolicyRow, PolicyStore, Store, StoreResult};

/// The tag values and end user of one request as quota subjects (issue 25 item 6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    /// Each tag: its key, its value, and the value's subject id.
    pub tags: Vec<(String, String, i64)>,
    /// The end user and their subject id.
    pub end_user: Option<(String, i64)>,
}

impl Labels {
    /// How a refusal names subject `id` of `kind`: `team=search`, or the end user's id.
    pub fn name_of(&self, kind: SubjectKind, id: i64) -> Option<String> {
        match kind {
            SubjectKind::Tag => self
                .tags
                .iter()
                .find(|t| t.2 == id)
                .map(|(k, v, _)| format!("{k}={v}")),
            SubjectKind::EndUser => self.end_user.as_ref().filter(|e| e.1 == id).map(|e| e.0.clone()),
            _ => None,
        }
    }
}

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

/// Every policy, by workspace, indexed so that finding a caller's costs the same with ten
/// policies or ten thousand.
#[derive(Debug, Default)]
pub struct Policies {
    /// Looked up on every request, as `named` is: Fx hashing (keys are ids, not client text).
    by_workspace: FxHashMap<i64, WorkspacePolicies>,
}

/// One workspace's policies, each with its place in the load order (the order they apply in).
#[derive(Debug, Default)]
struct WorkspacePolicies {
    /// Policies for each subject of their kind (`target = "*"`).
    each: Vec<(usize, PolicyRule)>,
    /// Policies naming one subject, by its kind and id.
    named: FxHashMap<(SubjectKind, i64), Vec<(usize, PolicyRule)>>,
    /// Tag policies on each value of one tag key (`target = "team=*"`), by the key.
    each_value_of: HashMap<String, Vec<(usize, PolicyRule)>>,
}

impl Policies {
    /// Loads every policy; a row that does not parse is skipped with an error in the log.
    pub async fn load(store: &Store) -> StoreResult<Policies> {
        let mut p = Policies::default();
        let rows = store.all_policies().await?;
        // A tag policy's target is a tag value, or `key=*` for each value of the key.
        let tag_targets: Vec<i64> = rows
            .iter()
            .filter(|r| r.subject == SubjectKind::Tag.as_str() && r.target_id != 0)
            .map(|r| r.target_id)
            .collect();
        let each_value_of: HashMap<i64, String> = if tag_targets.is_empty() {
            HashMap::new()
        } else {
            store
                .tag_values_with_ids(&tag_targets)
                .await?
                .into_iter()
                .filter(|t| t.tag_value == "*")
                .map(|t| (t.id, t.tag_key))
                .collect()
        };
        for (order, row) in rows.iter().enumerate() {
            match PolicyRule::from_row(row) {
                Some(r) => {
                    let key = (r.subject == SubjectKind::Tag)
                        .then(|| each_value_of.get(&r.target_id).cloned())
                        .flatten();
                    p.insert(order, r, row.workspace_id, key)
                }
                None => tracing::error!(policy = row.id, "unreadable policy row skipped"),
            }
        }
        Ok(p)
    }

    fn insert(&mut self, order: usize, rule: PolicyRule, workspace_id: i64, each_value_of: Option<String>) {
        let ws = self.by_workspace.entry(workspace_id).or_default();
        if let Some(key) = each_value_of {
            ws.each_value_of.entry(key).or_default().push((order, rule));
        } else if rule.target_id == 0 {
            ws.each.push((order, rule));
        } else {
            ws.named
                .entry((rule.subject, rule.target_id))
                .or_default()
                .push((order, rule));
        }
    }

    /// The policies that apply to `caller`, with the subject each one counts, in load order.
    pub fn applying_to<'a>(&'a self, caller: &Caller) -> Vec<(&'a PolicyRule, i64)> {
        self.applying_to_request(caller, &Labels::default())
    }

    /// The policies that apply to a request of `caller` carrying `labels`, with the subject each
    /// one counts, in load order. A tag policy counts each tag value it covers: `team=*` counts
    /// `team=search` on the same counter as a policy naming `team=search`.
    pub fn applying_to_request<'a>(&'a self, caller: &Caller, labels: &Labels) -> Vec<(&'a PolicyRule, i64)> {
        let Some(ws) = self.by_workspace.get(&caller.workspace_id) else {
            return Vec::new();
        };
        let subject_of = |kind: SubjectKind| match kind {
            SubjectKind::Apikey => Some(caller.key_id),
            SubjectKind::Member => Some(caller.member_id),
            SubjectKind::Dept => caller.department_id,
            SubjectKind::Ws => Some(caller.workspace_id),
            SubjectKind::Tag | SubjectKind::EndUser => None,
        };
        let mut found: Vec<(usize, &PolicyRule, i64)> = Vec::new();
        for (order, r) in &ws.each {
            match r.subject {
                SubjectKind::Tag => found.extend(labels.tags.iter().map(|t| (*order, r, t.2))),
                SubjectKind::EndUser => found.extend(labels.end_user.iter().map(|e| (*order, r, e.1))),
                _ => {}
            }
            if let Some(subject_id) = subject_of(r.subject)
                && (r.scope_department_id == 0 || Some(r.scope_department_id) == caller.department_id)
            {
                found.push((*order, r, subject_id));
            }
        }
        for (key, _, id) in &labels.tags {
            for (order, r) in ws.named.get(&(SubjectKind::Tag, *id)).into_iter().flatten() {
                found.push((*order, r, *id));
            }
            for (order, r) in ws.each_value_of.get(key).into_iter().flatten() {
                found.push((*order, r, *id));
            }
        }
        if let Some((_, id)) = &labels.end_user {
            for (order, r) in ws.named.get(&(SubjectKind::EndUser, *id)).into_iter().flatten() {
                found.push((*order, r, *id));
            }
        }
        for kind in [
            SubjectKind::Apikey,
            SubjectKind::Member,
            SubjectKind::Dept,
            SubjectKind::Ws,
        ] {
            let Some(subject_id) = subject_of(kind) else {
                continue;
            };
            for (order, r) in ws.named.get(&(kind, subject_id)).into_iter().flatten() {
                found.push((*order, r, subject_id));
            }
        }
        found.sort_unstable_by_key(|(order, _, _)| *order);
        found.into_iter().map(|(_, r, s)| (r, s)).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule as DESIGN.md §4 states it, by a scan of every policy: a policy applies when it
    /// names the caller's subject of its kind, or names each subject (optionally within a
    /// department the caller is in).
    fn by_scan<'a>(rules: &'a [(PolicyRule, i64)], caller: &Caller) -> Vec<(&'a PolicyRule, i64)> {
        rules
            .iter()
            .filter(|(_, ws)| *ws == caller.workspace_id)
            .filter_map(|(r, _)| {
                let subject_id = match r.subject {
                    SubjectKind::Apikey => caller.key_id,
                    SubjectKind::Member => caller.member_id,
                    SubjectKind::Dept => caller.department_id?,
                    SubjectKind::Ws => caller.workspace_id,
                    SubjectKind::Tag | SubjectKind::EndUser => return None,
                };
                let named = r.target_id == subject_id;
                let each = r.target_id == 0
                    && (r.scope_department_id == 0 || Some(r.scope_department_id) == caller.department_id);
                (named || each).then_some((r, subject_id))
            })
            .collect()
    }

    #[test]
    fn the_index_finds_what_a_scan_finds_in_the_same_order() {
        let kinds = [
            SubjectKind::Apikey,
            SubjectKind::Member,
            SubjectKind::Dept,
            SubjectKind::Ws,
        ];
        let mut rules = Vec::new();
        let mut id = 0;
        // Every kind, naming ids 0 (each) to 3, scoped to no department or department 2, in two
        // workspaces, interleaved so that the load order mixes named and each.
        for target_id in 0..4 {
            for scope in [0, 2] {
                for (k, kind) in kinds.iter().enumerate() {
                    id += 1;
                    let rule = PolicyRule {
                        id,
                        subject: *kind,
                        target_id,
                        scope_department_id: if target_id == 0 { scope } else { 0 },
                        metric: Metric::Requests,
                        window: Window::Day,
                        limit: 10,
                        mode: Mode::Enforce,
                    };
                    rules.push((rule, 1 + (k as i64 % 2)));
                }
            }
        }
        let mut policies = Policies::default();
        for (order, (r, ws)) in rules.iter().enumerate() {
            policies.insert(order, r.clone(), *ws, None);
        }
        for workspace_id in 1..=3 {
            for key_id in 1..=4 {
                for member_id in 1..=4 {
                    for department_id in [None, Some(1), Some(2), Some(3)] {
                        let caller = Caller {
                            key_id,
                            member_id,
                            department_id,
                            workspace_id,
                            models: Default::default(),
                            in_flight: Default::default(),
                            allowed_tags: None,
                        };
                        let ids = |v: Vec<(&PolicyRule, i64)>| {
                            v.iter().map(|(r, s)| (r.id, *s)).collect::<Vec<_>>()
                        };
                        assert_eq!(
                            ids(policies.applying_to(&caller)),
                            ids(by_scan(&rules, &caller)),
                            "{caller:?}"
                        );
                    }
                }
            }
        }
    }
}
