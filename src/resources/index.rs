//! What the store already holds of the tenancy a resources file names — workspaces, departments,
//! members and keys — read once per run, one query per table, instead of once per entry: a file
//! of 100,000 keys is checked and applied without 100,000 lookups.

use std::collections::HashMap;

use crate::store::{
    ApiKeyRow, Department, DepartmentStore, KeyStore, MemberRow, MemberStore, Store, StoreResult, Workspace,
    WorkspaceStore, fold_email,
};

/// The stored tenancy, by the names a resources file uses.
pub(super) struct Index {
    workspaces: HashMap<String, Workspace>,
    /// Workspace id → name.
    workspace_names: HashMap<i64, String>,
    departments: HashMap<(i64, String), Department>,
    /// By email (unique across workspaces).
    members: HashMap<String, MemberRow>,
    /// By (member id, name).
    keys: HashMap<(i64, String), ApiKeyRow>,
}

impl Index {
    /// Reads every workspace, department, member and key.
    pub async fn load(store: &Store) -> StoreResult<Index> {
        let mut index = Index {
            workspaces: HashMap::new(),
            workspace_names: HashMap::new(),
            departments: HashMap::new(),
            members: HashMap::new(),
            keys: HashMap::new(),
        };
        index.reload_workspaces(store).await?;
        for d in store.all_departments().await? {
            index.departments.insert((d.workspace_id, d.name.clone()), d);
        }
        index.reload_members(store).await?;
        index.reload_keys(store).await?;
        Ok(index)
    }

    /// Reads the workspaces again (after some were created).
    pub async fn reload_workspaces(&mut self, store: &Store) -> StoreResult<()> {
        let all = store.workspaces().await?;
        self.workspace_names = all.iter().map(|w| (w.id, w.name.clone())).collect();
        self.workspaces = all.into_iter().map(|w| (w.name.clone(), w)).collect();
        Ok(())
    }

    /// Reads the members again (after some were created).
    pub async fn reload_members(&mut self, store: &Store) -> StoreResult<()> {
        // By the folded email (one identity whatever its case); the oldest where stored
        // members differ only in case, as `member_by_email` finds them.
        self.members = HashMap::new();
        for m in store.all_members().await? {
            self.members.entry(fold_email(&m.email)).or_insert(m);
        }
        Ok(())
    }

    /// Reads the keys again (after some were created).
    pub async fn reload_keys(&mut self, store: &Store) -> StoreResult<()> {
        self.keys = store
            .all_keys()
            .await?
            .into_iter()
            .map(|k| ((k.member_id, k.name.clone()), k))
            .collect();
        Ok(())
    }

    /// Notes a department this run created.
    pub fn add_department(&mut self, d: Department) {
        self.departments.insert((d.workspace_id, d.name.clone()), d);
    }

    pub fn workspace(&self, name: &str) -> Option<&Workspace> {
        self.workspaces.get(name)
    }

    pub fn workspace_name(&self, id: i64) -> Option<&str> {
        self.workspace_names.get(&id).map(String::as_str)
    }

    pub fn department(&self, workspace_id: i64, name: &str) -> Option<&Department> {
        self.departments.get(&(workspace_id, name.to_owned()))
    }

    /// The department `name` of the workspace called `workspace`.
    pub fn department_in(&self, workspace: &str, name: &str) -> Option<&Department> {
        self.department(self.workspace(workspace)?.id, name)
    }

    pub fn member(&self, email: &str) -> Option<&MemberRow> {
        self.members.get(&fold_email(email))
    }

    pub fn key(&self, member_id: i64, name: &str) -> Option<&ApiKeyRow> {
        self.keys.get(&(member_id, name.to_owned()))
    }

    /// The key `email/name`.
    pub fn key_at(&self, email: &str, name: &str) -> Option<&ApiKeyRow> {
        self.key(self.member(email)?.id, name)
    }
}
