//! Applying a checked resources file: each entry upserted by name, counted as created, updated
//! or unchanged; nothing the file does not name is touched.

use std::collections::HashMap;

use super::check::Plan;
use super::spec::{
    ApiKeySpec, MemberSpec, ModelSpec, PolicySpec, ResourcesFile, UpstreamSpec, WorkspaceSpec,
};
use super::{ApplySummary, ResourcesError};
use crate::crypto::{self, MasterKey};
use crate::managed::{Kind, Managed};
use crate::quota::window::Window;
use crate::quota::{Metric, Mode, SubjectKind, credits_to_micros};
use crate::store::{
    DepartmentStore, KeyStore, MemberStore, ModelRow, ModelStore, NewMember, PolicyRow, PolicyStore,
    ServedModel, Store, StoreError, UpstreamRow, UpstreamStore, WorkspaceStore,
};
use crate::upstream::Provider;

/// The store, the time of this run, and the workspace ids looked up so far.
struct Applier<'a> {
    store: &'a Store,
    master: &'a MasterKey,
    now: i64,
    ws_ids: HashMap<String, i64>,
    summary: ApplySummary,
}

impl Applier<'_> {
    /// The id of a workspace `check` has proven to exist (or that this run created).
    async fn ws_id(&mut self, name: &str) -> Result<i64, ResourcesError> {
        if let Some(id) = self.ws_ids.get(name) {
            return Ok(*id);
        }
        let id = self
            .store
            .workspace_by_name(name)
            .await?
            .map(|w| w.id)
            .ok_or_else(|| StoreError::Corrupt(format!("workspace {name:?} vanished while applying")))?;
        self.ws_ids.insert(name.to_owned(), id);
        Ok(id)
    }

    /// Counts one entry into the summary.
    fn tally(&mut self, created: bool, changed: bool) {
        let s = &mut self.summary;
        if created {
            s.created += 1;
        } else if changed {
            s.updated += 1;
        } else {
            s.unchanged += 1;
        }
    }
}

/// Upserts every entry of `f`, in the order of their references.
pub(super) async fn apply(
    store: &Store,
    master: &MasterKey,
    f: &ResourcesFile,
    plan: &Plan,
    now: i64,
) -> Result<ApplySummary, ResourcesError> {
    let mut a = Applier {
        store,
        master,
        now,
        ws_ids: HashMap::new(),
        summary: ApplySummary::default(),
    };
    for w in &f.workspace {
        workspace(&mut a, w).await?;
    }
    for d in &f.department {
        let ws = a.ws_id(&d.workspace).await?;
        let exists = store.department_by_name(ws, &d.name).await?.is_some();
        if !exists {
            store.create_department(ws, &d.name, now).await?;
        }
        a.tally(!exists, false);
    }
    for m in &f.member {
        member(&mut a, m).await?;
    }
    for k in &f.api_key {
        api_key(&mut a, k).await?;
    }
    for (u, (provider, base_url, served)) in f.upstream.iter().zip(&plan.upstreams) {
        upstream(&mut a, u, *provider, base_url, served).await?;
    }
    for m in &f.model {
        model(&mut a, m).await?;
    }
    for (p, resolved) in f.policy.iter().zip(&plan.policies) {
        policy(&mut a, p, *resolved).await?;
    }
    Ok(a.summary)
}

async fn workspace(a: &mut Applier<'_>, w: &WorkspaceSpec) -> Result<(), ResourcesError> {
    match a.store.workspace_by_name(&w.name).await? {
        None => {
            a.store
                .create_workspace(&w.name, w.timezone.as_deref(), a.now)
                .await?;
            a.tally(true, false);
        }
        Some(existing) => {
            let changed = existing.timezone != w.timezone;
            if changed {
                a.store
                    .set_workspace_timezone(existing.id, w.timezone.as_deref())
                    .await?;
            }
            a.tally(false, changed);
        }
    }
    Ok(())
}

async fn member(a: &mut Applier<'_>, m: &MemberSpec) -> Result<(), ResourcesError> {
    let store = a.store;
    let ws = a.ws_id(&m.workspace).await?;
    let dept = match &m.department {
        Some(d) => store.department_by_name(ws, d).await?.map(|d| d.id),
        None => None,
    };
    let allowed = declared_models(&m.allowed_models);
    let Some(existing) = store.member_by_email(&m.email).await? else {
        let hash = m.password.as_deref().map(crypto::hash_password);
        let new = NewMember {
            workspace_id: ws,
            department_id: dept,
            email: &m.email,
            role: &m.role,
            password_hash: hash.as_deref(),
        };
        let created = store.create_member(&new, a.now).await?;
        if allowed.is_some() || m.max_in_flight.is_some() {
            store
                .set_member_guardrails(created.id, allowed.as_deref(), m.max_in_flight)
                .await?;
        }
        a.tally(true, false);
        return Ok(());
    };
    let mut changed = false;
    if existing.allowed_models != allowed || existing.max_in_flight != m.max_in_flight {
        store
            .set_member_guardrails(existing.id, allowed.as_deref(), m.max_in_flight)
            .await?;
        changed = true;
    }
    if existing.department_id != dept || existing.role != m.role {
        store.update_member(existing.id, dept, &m.role).await?;
        changed = true;
    }
    if let Some(p) = &m.password
        && !existing
            .password_hash
            .as_deref()
            .is_some_and(|h| crypto::verify_password(p, h))
    {
        store
            .set_member_password(existing.id, &crypto::hash_password(p))
            .await?;
        changed = true;
    }
    a.tally(false, changed);
    Ok(())
}

async fn api_key(a: &mut Applier<'_>, k: &ApiKeySpec) -> Result<(), ResourcesError> {
    let store = a.store;
    let member = store
        .member_by_email(&k.member)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("member {:?} vanished while applying", k.member)))?;
    let allowed = declared_models(&k.allowed_models);
    match store.key_by_name(member.id, &k.name).await? {
        None => {
            let plain = match &k.key {
                Some(key) => key.clone(),
                None => {
                    let key = crypto::generate_api_key();
                    a.summary
                        .generated_keys
                        .push((format!("{}/{}", k.member, k.name), key.clone()));
                    key
                }
            };
            let created = store
                .create_key(
                    member.workspace_id,
                    member.id,
                    Some(member.id),
                    &k.name,
                    &crypto::hash_api_key(&plain),
                    &crypto::display_prefix(&plain),
                    a.now,
                )
                .await?;
            if allowed.is_some() || k.max_in_flight.is_some() {
                store
                    .set_key_guardrails(created.id, allowed.as_deref(), k.max_in_flight)
                    .await?;
            }
            a.tally(true, false);
        }
        Some(existing) => {
            let new_hash = k.key.as_deref().map(crypto::hash_api_key);
            let new_secret = new_hash.as_ref().is_some_and(|h| *h != existing.key_hash);
            if let (true, Some(h), Some(plain)) = (new_secret, &new_hash, &k.key) {
                store
                    .set_key_hash(existing.id, h, &crypto::display_prefix(plain))
                    .await?;
            }
            let new_guardrails =
                existing.allowed_models != allowed || existing.max_in_flight != k.max_in_flight;
            if new_guardrails {
                store
                    .set_key_guardrails(existing.id, allowed.as_deref(), k.max_in_flight)
                    .await?;
            }
            a.tally(false, new_secret || new_guardrails);
        }
    }
    Ok(())
}

/// A declared model allow-list as stored (trimmed as `check` accepted it); none when absent, so
/// the file states the whole of a key's or member's guardrails.
fn declared_models(list: &Option<Vec<String>>) -> Option<String> {
    let trimmed: Option<Vec<String>> = list
        .as_ref()
        .map(|l| l.iter().map(|m| m.trim().to_owned()).collect());
    crate::caller::encode_model_list(trimmed.as_deref())
}

async fn upstream(
    a: &mut Applier<'_>,
    u: &UpstreamSpec,
    provider: Provider,
    base_url: &str,
    served: &[(String, String)],
) -> Result<(), ResourcesError> {
    let (store, now) = (a.store, a.now);
    let ws = a.ws_id(&u.workspace).await?;
    let models: Vec<ServedModel> = served
        .iter()
        .map(|(name, upstream)| ServedModel {
            name: name.clone(),
            upstream: upstream.clone(),
        })
        .collect();
    let existing = store.upstream_by_name(ws, &u.name).await?;
    // Re-sealing draws a new nonce, so keep the stored ciphertext when the secret is the same.
    let secret_sealed = match &existing {
        Some(e) if a.master.open(&e.secret_sealed).ok().as_deref() == Some(u.api_key.as_str()) => {
            e.secret_sealed.clone()
        }
        _ => a.master.seal(&u.api_key),
    };
    let mut row = UpstreamRow {
        id: existing.as_ref().map_or(0, |e| e.id),
        workspace_id: ws,
        name: u.name.clone(),
        provider: provider.as_str().to_owned(),
        base_url: base_url.to_owned(),
        secret_sealed,
        models: serde_json::to_string(&models).unwrap_or_else(|_| "[]".into()),
        priority: u.priority,
        weight: u.weight,
        max_in_flight: u.max_in_flight,
        requests_per_minute: u.limits.requests_per_minute,
        tokens_per_minute: u.limits.tokens_per_minute,
        requests_per_day: u.limits.requests_per_day,
        quota_group: u.quota_group.clone(),
        enabled: i64::from(u.enabled),
        created_at: existing.as_ref().map_or(now, |e| e.created_at),
        updated_at: existing.as_ref().map_or(now, |e| e.updated_at),
    };
    let changed = existing.as_ref().is_some_and(|e| *e != row);
    if existing.is_none() || changed {
        row.updated_at = now;
        store.save_upstream(&row).await?;
    }
    // kRouter: a new secret clears the per-model locks, not the account holds.
    if let Some(e) = &existing
        && e.secret_sealed != row.secret_sealed
    {
        crate::upstream::locks::clear_model_locks(store, e.id).await?;
    }
    a.tally(existing.is_none(), changed);
    Ok(())
}

async fn model(a: &mut Applier<'_>, m: &ModelSpec) -> Result<(), ResourcesError> {
    let (store, now) = (a.store, a.now);
    let ws = a.ws_id(&m.workspace).await?;
    let existing = store.model_by_name(ws, &m.name).await?;
    let row = ModelRow {
        id: existing.as_ref().map_or(0, |e| e.id),
        workspace_id: ws,
        name: m.name.clone(),
        fallbacks: serde_json::to_string(&m.fallbacks).unwrap_or_else(|_| "[]".into()),
        price_prompt: m.price.as_ref().map_or(0, |p| credits_to_micros(p.prompt)),
        price_completion: m.price.as_ref().map_or(0, |p| credits_to_micros(p.completion)),
        created_at: existing.as_ref().map_or(now, |e| e.created_at),
    };
    let changed = existing.as_ref().is_some_and(|e| *e != row);
    if existing.is_none() || changed {
        store.save_model(&row).await?;
    }
    a.tally(existing.is_none(), changed);
    Ok(())
}

async fn policy(
    a: &mut Applier<'_>,
    p: &PolicySpec,
    (subject, metric, window, mode, limit): (SubjectKind, Metric, Window, Mode, i64),
) -> Result<(), ResourcesError> {
    let (store, now) = (a.store, a.now);
    let ws = a.ws_id(&p.workspace).await?;
    let target_id = resolve_target(store, ws, subject, &p.target).await?;
    let scope = match &p.department {
        Some(d) => store.department_by_name(ws, d).await?.map_or(0, |d| d.id),
        None => 0,
    };
    let window = window.to_string();
    let existing = store
        .policy_by_key(ws, subject.as_str(), target_id, scope, metric.as_str(), &window)
        .await?;
    let mut row = PolicyRow {
        id: existing.as_ref().map_or(0, |e| e.id),
        workspace_id: ws,
        subject: subject.as_str().to_owned(),
        target_id,
        scope_department_id: scope,
        metric: metric.as_str().to_owned(),
        time_window: window,
        limit_value: limit,
        mode: mode.as_str().to_owned(),
        // Set by the file, i.e. by its operator: read-only to members, even when it takes
        // over a budget a member had set on their own key.
        created_by: None,
        created_at: existing.as_ref().map_or(now, |e| e.created_at),
        updated_at: existing.as_ref().map_or(now, |e| e.updated_at),
    };
    let changed = existing.as_ref().is_some_and(|e| *e != row);
    if existing.is_none() || changed {
        row.updated_at = now;
        store.save_policy(&row).await?;
    }
    a.tally(existing.is_none(), changed);
    Ok(())
}

/// The ids of every entity the file declares, once applied.
pub(super) async fn declared(
    store: &Store,
    f: &ResourcesFile,
    plan: &Plan,
) -> Result<Managed, ResourcesError> {
    let mut m = Managed::default();
    let mut ws_ids: HashMap<&str, i64> = HashMap::new();
    for w in &f.workspace {
        if let Some(ws) = store.workspace_by_name(&w.name).await? {
            m.insert(Kind::Workspace, ws.id);
            ws_ids.insert(&w.name, ws.id);
        }
    }
    let ws = async |name: &str| -> Result<Option<i64>, ResourcesError> {
        if let Some(id) = ws_ids.get(name) {
            return Ok(Some(*id));
        }
        Ok(store.workspace_by_name(name).await?.map(|w| w.id))
    };
    for d in &f.department {
        if let Some(w) = ws(&d.workspace).await?
            && let Some(dept) = store.department_by_name(w, &d.name).await?
        {
            m.insert(Kind::Department, dept.id);
        }
    }
    for mem in &f.member {
        if let Some(row) = store.member_by_email(&mem.email).await? {
            m.insert(Kind::Member, row.id);
        }
    }
    for k in &f.api_key {
        if let Some(member) = store.member_by_email(&k.member).await?
            && let Some(key) = store.key_by_name(member.id, &k.name).await?
        {
            m.insert(Kind::ApiKey, key.id);
        }
    }
    for u in &f.upstream {
        if let Some(w) = ws(&u.workspace).await?
            && let Some(up) = store.upstream_by_name(w, &u.name).await?
        {
            m.insert(Kind::Upstream, up.id);
        }
    }
    for model in &f.model {
        if let Some(w) = ws(&model.workspace).await?
            && let Some(row) = store.model_by_name(w, &model.name).await?
        {
            m.insert(Kind::Model, row.id);
        }
    }
    for (p, (subject, metric, window, _, _)) in f.policy.iter().zip(&plan.policies) {
        let Some(w) = ws(&p.workspace).await? else {
            continue;
        };
        let target_id = resolve_target(store, w, *subject, &p.target).await?;
        let scope = match &p.department {
            Some(d) => store.department_by_name(w, d).await?.map_or(0, |d| d.id),
            None => 0,
        };
        let window = window.to_string();
        if let Some(row) = store
            .policy_by_key(w, subject.as_str(), target_id, scope, metric.as_str(), &window)
            .await?
        {
            m.insert(Kind::Policy, row.id);
        }
    }
    Ok(m)
}

/// The id a policy target names (0 for `*`), once `check` has proven it exists.
async fn resolve_target(
    store: &Store,
    ws: i64,
    subject: SubjectKind,
    target: &str,
) -> Result<i64, ResourcesError> {
    if target == "*" {
        return Ok(0);
    }
    let id = match subject {
        SubjectKind::Apikey => match target.split_once('/') {
            Some((email, name)) => match store.member_by_email(email).await? {
                Some(m) => store.key_by_name(m.id, name).await?.map(|k| k.id),
                None => None,
            },
            None => None,
        },
        SubjectKind::Member => store.member_by_email(target).await?.map(|m| m.id),
        SubjectKind::Dept => store.department_by_name(ws, target).await?.map(|d| d.id),
        SubjectKind::Ws => Some(ws),
    };
    id.ok_or_else(|| StoreError::Corrupt(format!("policy target {target:?} vanished while applying")).into())
}
