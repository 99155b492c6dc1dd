//! What guardrail policies name: the members, keys, departments and labels of a workspace, by
//! id, loaded once for a page of policies (`policies.rs`).

use std::collections::HashMap;

use super::{AdminResult, store_error};
use crate::quota::SubjectKind;
use crate::quota::engine::PolicyRule;
use crate::state::AppState;
use crate::store::{AdminStore, ApiKeyRow, Department, MemberRow, PolicyRow, Table, WorkspaceStore};

/// The workspace's members, keys and departments, by id: what policies name.
pub(super) struct Names {
    pub(super) workspace_id: i64,
    pub(super) workspace: String,
    pub(super) members: HashMap<i64, MemberRow>,
    pub(super) keys: HashMap<i64, ApiKeyRow>,
    pub(super) departments: HashMap<i64, Department>,
    /// Tag values and end users of this workspace that policies or counters name.
    pub(super) labels: super::policy_labels::LabelNames,
}

impl Names {
    /// Every member, key and department of workspace `ws`.
    pub(super) async fn load(state: &AppState, ws: i64) -> AdminResult<Names> {
        let store = &state.store;
        let members: Vec<MemberRow> = store.rows_in(Table::Members, ws).await.map_err(store_error)?;
        let keys: Vec<ApiKeyRow> = store.rows_in(Table::ApiKeys, ws).await.map_err(store_error)?;
        let labels = super::policy_labels::LabelNames::of_policies(state, ws).await?;
        Names::of(state, ws, members, keys, labels).await
    }

    /// What the policies `rows` of workspace `ws` name: their target members and keys, the
    /// members of those keys, and every department (a page of the list needs no more).
    pub(super) async fn of_policies(state: &AppState, ws: i64, rows: &[PolicyRow]) -> AdminResult<Names> {
        let store = &state.store;
        let targets = |subject: &str| -> Vec<i64> {
            rows.iter()
                .filter(|p| p.subject == subject && p.target_id != 0)
                .map(|p| p.target_id)
                .collect()
        };
        let keys: Vec<ApiKeyRow> = store
            .rows_with_ids(Table::ApiKeys, ws, &targets("apikey"))
            .await
            .map_err(store_error)?;
        let mut member_ids = targets("member");
        member_ids.extend(keys.iter().map(|k| k.member_id));
        member_ids.sort_unstable();
        member_ids.dedup();
        let members: Vec<MemberRow> = store
            .rows_with_ids(Table::Members, ws, &member_ids)
            .await
            .map_err(store_error)?;
        // The labels of this page's policies only: reading every policy of the workspace for
        // each page cost 100 ms a page with 10,000 policies (bench/scale.py).
        let labels = super::policy_labels::LabelNames::of_rows(state, ws, rows).await?;
        Names::of(state, ws, members, keys, labels).await
    }

    pub(super) async fn of(
        state: &AppState,
        ws: i64,
        members: Vec<MemberRow>,
        keys: Vec<ApiKeyRow>,
        labels: super::policy_labels::LabelNames,
    ) -> AdminResult<Names> {
        let store = &state.store;
        let departments: Vec<Department> =
            store.rows_in(Table::Departments, ws).await.map_err(store_error)?;
        Ok(Names {
            labels,
            workspace_id: ws,
            workspace: store
                .workspace(ws)
                .await
                .map_err(store_error)?
                .map(|w| w.name)
                .unwrap_or_default(),
            members: members.into_iter().map(|m| (m.id, m)).collect(),
            keys: keys.into_iter().map(|k| (k.id, k)).collect(),
            departments: departments.into_iter().map(|d| (d.id, d)).collect(),
        })
    }

    pub(super) fn member(&self, id: i64) -> Option<&MemberRow> {
        self.members.get(&id)
    }

    pub(super) fn key(&self, id: i64) -> Option<&ApiKeyRow> {
        self.keys.get(&id)
    }

    pub(super) fn department(&self, id: i64) -> Option<&Department> {
        self.departments.get(&id)
    }

    /// How the console names one subject: a key as `<email>/<name>`, a member by email, a
    /// department or the workspace by name; none when it is not in this workspace.
    pub(super) fn subject_name(&self, kind: SubjectKind, id: i64) -> Option<String> {
        match kind {
            SubjectKind::Apikey => self.key(id).map(|k| {
                let email = self.member(k.member_id).map_or("", |m| m.email.as_str());
                format!("{email}/{}", k.name)
            }),
            SubjectKind::Member => self.member(id).map(|m| m.email.clone()),
            SubjectKind::Dept => self.department(id).map(|d| d.name.clone()),
            SubjectKind::Ws => (id == self.workspace_id).then(|| self.workspace.clone()),
            SubjectKind::Tag | SubjectKind::EndUser => self.labels.name(kind, id),
        }
    }

    /// Whether `rule` counts subject `id` (of the rule's kind, in this workspace): its one
    /// target, or, for "each", every subject of the kind inside its department if it names one.
    pub(super) fn covers(&self, rule: &PolicyRule, id: i64) -> bool {
        if matches!(rule.subject, SubjectKind::Tag | SubjectKind::EndUser) {
            return self.labels.covers(rule, id);
        }
        if rule.target_id != 0 {
            return rule.target_id == id;
        }
        let scope = rule.scope_department_id;
        let in_scope = |dept: Option<i64>| scope == 0 || dept == Some(scope);
        match rule.subject {
            SubjectKind::Apikey => self
                .key(id)
                .is_some_and(|k| in_scope(self.member(k.member_id).and_then(|m| m.department_id))),
            SubjectKind::Member => self.member(id).is_some_and(|m| in_scope(m.department_id)),
            SubjectKind::Dept => self.department(id).is_some() && in_scope(Some(id)),
            SubjectKind::Ws => id == self.workspace_id,
            SubjectKind::Tag | SubjectKind::EndUser => false,
        }
    }

    /// How the console names a policy's target.
    pub(super) fn label(&self, p: &PolicyRow) -> String {
        if p.target_id == 0 {
            return "*".into();
        }
        match p.subject.as_str() {
            "apikey" => self.key(p.target_id).map_or_else(String::new, |k| {
                let email = self.member(k.member_id).map_or("", |m| m.email.as_str());
                format!("{email}/{}", k.name)
            }),
            "member" => self
                .member(p.target_id)
                .map(|m| m.email.clone())
                .unwrap_or_default(),
            "dept" => self
                .department(p.target_id)
                .map(|d| d.name.clone())
                .unwrap_or_default(),
            "tag" | "end_user" => {
                let kind = p.subject.parse().unwrap_or(SubjectKind::Tag);
                self.labels.name(kind, p.target_id).unwrap_or_default()
            }
            _ => self.workspace.clone(),
        }
    }
}
