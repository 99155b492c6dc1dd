//! Applying a checked resources file: each entry upserted by name, counted as created, updated
//! or unchanged; nothing the file does not name is touched.

use super::check::Plan;
use super::index::Index;
use super::spec::{
    ApiKeySpec, MemberSpec, ModelSpec, PolicySpec, ResourcesFile, UpstreamSpec, WorkspaceSpec,
};
use super::{ApplySummary, ResourcesError};
use crate::alerts::settings::{Thresholds, Webhook};
use crate::kernel::credits::credits_to_micros;
use crate::kernel::crypto::{self, MasterKey};
use crate::kernel::managed::{Kind, Managed};
use crate::provider::Provider;
use crate::quota::window::Window;
use crate::quota::{Metric, Mode, SubjectKind};
use crate::store::{
    DepartmentStore, KeyGuardrails, KeyStore, LabelStore, MemberStore, ModelRow, ModelStore, NewKey,
    NewMember, PolicyRow, PolicyStore, ServedModel, Store, StoreError, UpstreamRow, UpstreamStore,
    WorkspaceStore,
};
use crate::validate;

/// The store, the time of this run, and what the store holds of the tenancy.
struct Applier<'a> {
    store: &'a Store,
    master: &'a MasterKey,
    now: i64,
    index: &'a mut Index,
    summary: ApplySummary,
}

/// `check` proved it exists; it vanished since.
fn vanished(what: &str, name: &str) -> ResourcesError {
    StoreError::Corrupt(format!("{what} {name:?} vanished while applying")).into()
}

impl Applier<'_> {
    /// The id of a workspace `check` has proven to exist (or that this run created).
    fn ws_id(&self, name: &str) -> Result<i64, ResourcesError> {
        self.index
            .workspace(name)
            .map(|w| w.id)
            .ok_or_else(|| vanished("workspace", name))
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

/// Upserts every entry of `f`, in the order of their references. Members and keys, the tables a
/// large tenancy has many rows of, are created in bulk.
pub(super) async fn apply(
    store: &Store,
    master: &MasterKey,
    index: &mut Index,
    f: &ResourcesFile,
    plan: &Plan,
    now: i64,
) -> Result<ApplySummary, ResourcesError> {
    let mut a = Applier {
        store,
        master,
        now,
        index,
        summary: ApplySummary::default(),
    };
    for w in &f.workspace {
        workspace(&mut a, w).await?;
    }
    a.index.reload_workspaces(store).await?;
    for d in &f.department {
        let ws = a.ws_id(&d.workspace)?;
        let exists = a.index.department(ws, &d.name).is_some();
        if !exists {
            let created = store.create_department(ws, &d.name, now).await?;
            a.index.add_department(created);
        }
        a.tally(!exists, false);
    }
    members(&mut a, &f.member).await?;
    api_keys(&mut a, &f.api_key).await?;
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

/// Creates the members the store lacks (in bulk) and updates the others one by one.
async fn members(a: &mut Applier<'_>, specs: &[MemberSpec]) -> Result<(), ResourcesError> {
    let store = a.store;
    // (workspace, department, password hash) of each member to create.
    let mut new: Vec<(&MemberSpec, i64, Option<i64>, Option<String>)> = Vec::new();
    for m in specs {
        let ws = a.ws_id(&m.workspace)?;
        let dept = m
            .department
            .as_deref()
            .and_then(|d| a.index.department(ws, d))
            .map(|d| d.id);
        let allowed = declared_models(&m.allowed_models);
        let Some(existing) = a.index.member(&m.email) else {
            new.push((m, ws, dept, m.password.as_deref().map(crypto::hash_password)));
            a.tally(true, false);
            continue;
        };
        let (id, mut changed) = (existing.id, false);
        if existing.allowed_models != allowed || existing.max_in_flight != m.max_in_flight {
            store
                .set_member_guardrails(id, allowed.as_deref(), m.max_in_flight)
                .await?;
            changed = true;
        }
        if existing.department_id != dept || existing.role != m.role {
            store.update_member(id, dept, &m.role).await?;
            changed = true;
        }
        if let Some(p) = &m.password
            && !existing
                .password_hash
                .as_deref()
                .is_some_and(|h| crypto::verify_password(p, h))
        {
            store.set_member_password(id, &crypto::hash_password(p)).await?;
            changed = true;
        }
        a.tally(false, changed);
    }
    if new.is_empty() {
        return Ok(());
    }
    let rows: Vec<NewMember> = new
        .iter()
        .map(|(m, ws, dept, hash)| NewMember {
            workspace_id: *ws,
            department_id: *dept,
            email: &m.email,
            role: &m.role,
            password_hash: hash.as_deref(),
        })
        .collect();
    store.create_members(&rows, a.now).await?;
    a.index.reload_members(store).await?;
    for (m, ..) in &new {
        let allowed = declared_models(&m.allowed_models);
        if (allowed.is_some() || m.max_in_flight.is_some())
            && let Some(created) = a.index.member(&m.email)
        {
            store
                .set_member_guardrails(created.id, allowed.as_deref(), m.max_in_flight)
                .await?;
        }
    }
    Ok(())
}

/// Creates the keys the store lacks (in bulk) and, for the others, replaces the secret where the
/// file names a new one and sets the guardrails it states.
async fn api_keys(a: &mut Applier<'_>, specs: &[ApiKeySpec]) -> Result<(), ResourcesError> {
    let store = a.store;
    // (workspace, member, hash, display prefix) of each key to create.
    let mut new: Vec<(&ApiKeySpec, i64, i64, String, String)> = Vec::new();
    for k in specs {
        let member = a
            .index
            .member(&k.member)
            .ok_or_else(|| vanished("member", &k.member))?;
        let (ws, member_id) = (member.workspace_id, member.id);
        let Some(existing) = a.index.key(member_id, &k.name) else {
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
            let (hash, prefix) = (crypto::hash_api_key(&plain), crypto::display_prefix(&plain));
            new.push((k, ws, member_id, hash, prefix));
            a.tally(true, false);
            continue;
        };
        let new_hash = k.key.as_deref().map(crypto::hash_api_key);
        let new_secret = new_hash.as_ref().is_some_and(|h| *h != existing.key_hash);
        if let (true, Some(h), Some(plain)) = (new_secret, &new_hash, &k.key) {
            store
                .set_key_hash(existing.id, h, &crypto::display_prefix(plain))
                .await?;
        }
        let declared = declared_guardrails(k);
        let new_guardrails = KeyGuardrails::of(existing) != declared;
        if new_guardrails {
            store.set_key_guardrails(existing.id, &declared).await?;
        }
        a.tally(false, new_secret || new_guardrails);
    }
    if new.is_empty() {
        return Ok(());
    }
    let rows: Vec<NewKey> = new
        .iter()
        .map(|(k, ws, member_id, hash, prefix)| NewKey {
            workspace_id: *ws,
            member_id: *member_id,
            created_by: Some(*member_id),
            name: &k.name,
            key_hash: hash,
            prefix,
        })
        .collect();
    store.create_keys(&rows, a.now).await?;
    a.index.reload_keys(store).await?;
    for (k, _, member_id, ..) in &new {
        let declared = declared_guardrails(k);
        if !declared.is_empty()
            && let Some(created) = a.index.key(*member_id, &k.name)
        {
            store.set_key_guardrails(created.id, &declared).await?;
        }
    }
    Ok(())
}

/// A key's guardrails as the file states them, whole: what it leaves out is removed.
fn declared_guardrails(k: &ApiKeySpec) -> KeyGuardrails {
    KeyGuardrails {
        allowed_models: declared_models(&k.allowed_models),
        max_in_flight: k.max_in_flight,
        // `check` accepted it.
        expires_at: k
            .expires_at
            .as_deref()
            .and_then(|t| validate::expires_at("expires_at", t).ok()),
        allowed_tags: declared_models(&k.allowed_tags),
    }
}

/// A declared model allow-list as stored (trimmed as `check` accepted it); none when absent, so
/// the file states the whole of a key's or member's guardrails.
fn declared_models(list: &Option<Vec<String>>) -> Option<String> {
    let trimmed: Option<Vec<String>> = list
        .as_ref()
        .map(|l| l.iter().map(|m| m.trim().to_owned()).collect());
    crate::kernel::caller::encode_model_list(trimmed.as_deref())
}

async fn upstream(
    a: &mut Applier<'_>,
    u: &UpstreamSpec,
    provider: Provider,
    base_url: &str,
    served: &[(String, String)],
) -> Result<(), ResourcesError> {
    let (store, now) = (a.store, a.now);
    let ws = a.ws_id(&u.workspace)?;
    let models: Vec<ServedModel> = served
        .iter()
        .map(|(name, upstream)| ServedModel {
            name: name.clone(),
            upstream: upstream.clone(),
        })
        .collect();
    let existing = store.upstream_by_name(ws, &u.name).await?;
    // Re-sealing draws a new nonce, so keep the stored ciphertext when the secret is the same.
    let secret = super::bedrock::secret(u, provider);
    let secret_sealed = match &existing {
        Some(e) if a.master.open(&e.secret_sealed).ok().as_deref() == Some(secret.as_str()) => {
            e.secret_sealed.clone()
        }
        _ => a.master.seal(&secret),
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
        crate::upstream::pool::locks::clear_model_locks(store, e.id).await?;
    }
    a.tally(existing.is_none(), changed);
    Ok(())
}

async fn model(a: &mut Applier<'_>, m: &ModelSpec) -> Result<(), ResourcesError> {
    let (store, now) = (a.store, a.now);
    let ws = a.ws_id(&m.workspace)?;
    let existing = store.model_by_name(ws, &m.name).await?;
    let row = ModelRow {
        id: existing.as_ref().map_or(0, |e| e.id),
        workspace_id: ws,
        name: m.name.clone(),
        fallbacks: serde_json::to_string(&m.fallbacks).unwrap_or_else(|_| "[]".into()),
        price_prompt: m.price.as_ref().map_or(0, |p| credits_to_micros(p.prompt)),
        price_completion: m.price.as_ref().map_or(0, |p| credits_to_micros(p.completion)),
        created_at: existing.as_ref().map_or(now, |e| e.created_at),
        max_output_tokens: m.max_output_tokens,
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
    let ws = a.ws_id(&p.workspace)?;
    let target_id = resolve_target(store, a.index, ws, subject, &p.target, now).await?;
    let scope = match &p.department {
        Some(d) => a.index.department(ws, d).map_or(0, |d| d.id),
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
    let mut changed = existing.as_ref().is_some_and(|e| *e != row);
    if existing.is_none() || changed {
        row.updated_at = now;
        row.id = store.save_policy(&row).await?;
    }
    changed |= policy_alerts(a, p, ws, row.id).await? && existing.is_some();
    if existing.is_none() {
        a.summary.new_policies.push(row);
    }
    a.tally(existing.is_none(), changed);
    Ok(())
}

/// Sets the policy's budget alerts as the file declares them (none when it declares none: the
/// file's policy is the file's); whether they changed.
async fn policy_alerts(
    a: &Applier<'_>,
    p: &PolicySpec,
    ws: i64,
    policy_id: i64,
) -> Result<bool, ResourcesError> {
    use crate::store::{AlertStore, PolicyAlertRow};
    let current = a
        .store
        .policy_alerts_in(ws)
        .await?
        .into_iter()
        .find(|r| r.policy_id == policy_id);
    let Some(spec) = &p.alerts else {
        if current.is_some() {
            a.store.set_policy_alerts(policy_id, None).await?;
        }
        return Ok(current.is_some());
    };
    let thresholds = Thresholds::parse("alerts.at", &spec.at)
        .unwrap_or_default()
        .stored();
    let webhook = Webhook::parse("alerts.webhook", &spec.webhook)
        .unwrap_or_default()
        .into_string();
    // A sealed secret differs at every sealing: compare what it opens to.
    let same_secret = |c: &PolicyAlertRow| match (&c.secret_sealed, &spec.secret) {
        (None, None) => true,
        (Some(sealed), Some(plain)) => a.master.open(sealed).is_ok_and(|s| s == *plain),
        _ => false,
    };
    let unchanged = current
        .as_ref()
        .is_some_and(|c| c.thresholds == thresholds && c.webhook == webhook && same_secret(c));
    if !unchanged {
        let row = PolicyAlertRow {
            policy_id,
            workspace_id: ws,
            thresholds,
            webhook,
            secret_sealed: spec.secret.as_deref().map(|s| a.master.seal(s)),
            updated_at: a.now,
        };
        a.store.set_policy_alerts(policy_id, Some(&row)).await?;
    }
    Ok(!unchanged)
}

/// The ids of every entity the file declares, once applied (`index` read after the apply).
pub(super) async fn declared(
    store: &Store,
    index: &Index,
    f: &ResourcesFile,
    plan: &Plan,
) -> Result<Managed, ResourcesError> {
    let mut m = Managed::default();
    let ws = |name: &str| index.workspace(name).map(|w| w.id);
    for w in &f.workspace {
        if let Some(id) = ws(&w.name) {
            m.insert(Kind::Workspace, id);
        }
    }
    for d in &f.department {
        if let Some(dept) = index.department_in(&d.workspace, &d.name) {
            m.insert(Kind::Department, dept.id);
        }
    }
    for mem in &f.member {
        if let Some(row) = index.member(&mem.email) {
            m.insert(Kind::Member, row.id);
        }
    }
    for k in &f.api_key {
        if let Some(key) = index.key_at(&k.member, &k.name) {
            m.insert(Kind::ApiKey, key.id);
        }
    }
    for u in &f.upstream {
        if let Some(w) = ws(&u.workspace)
            && let Some(up) = store.upstream_by_name(w, &u.name).await?
        {
            m.insert(Kind::Upstream, up.id);
        }
    }
    for model in &f.model {
        if let Some(w) = ws(&model.workspace)
            && let Some(row) = store.model_by_name(w, &model.name).await?
        {
            m.insert(Kind::Model, row.id);
        }
    }
    for (p, (subject, metric, window, _, _)) in f.policy.iter().zip(&plan.policies) {
        let Some(w) = ws(&p.workspace) else {
            continue;
        };
        let target_id = resolve_target(store, index, w, *subject, &p.target, 0).await?;
        let scope = match &p.department {
            Some(d) => index.department(w, d).map_or(0, |d| d.id),
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

/// The id a policy target names (0 for `*`), once `check` has proven it exists; a tag value or
/// end user is made if new (an operator's target is not held to the caps on what clients send).
async fn resolve_target(
    store: &Store,
    index: &Index,
    ws: i64,
    subject: SubjectKind,
    target: &str,
    now: i64,
) -> Result<i64, ResourcesError> {
    if target == "*" {
        return Ok(0);
    }
    let id = match subject {
        SubjectKind::Tag => {
            let (key, value) = target.split_once('=').unwrap_or((target, ""));
            store.tag_value_id(ws, key, value, None, now).await?.ok()
        }
        SubjectKind::EndUser => store.end_user_id(ws, target.trim(), None, now).await?.ok(),
        SubjectKind::Apikey => target
            .split_once('/')
            .and_then(|(email, name)| index.key_at(email, name))
            .map(|k| k.id),
        SubjectKind::Member => index.member(target).map(|m| m.id),
        SubjectKind::Dept => index.department(ws, target).map(|d| d.id),
        SubjectKind::Ws => Some(ws),
    };
    id.ok_or_else(|| vanished("policy target", target))
}
