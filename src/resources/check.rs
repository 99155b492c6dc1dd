//! Checking a whole resources file before anything is written: each entry's fields (by the
//! rules of [`crate::validate`], shared with the admin API), duplicates, and references to what
//! the file declares or the database holds.

use std::collections::{HashMap, HashSet};

use super::index::Index;
use super::spec::{
    ApiKeySpec, DepartmentSpec, MemberSpec, ModelSpec, PolicySpec, ResourcesFile, ServedModelSpec,
    UpstreamSpec, WorkspaceSpec,
};
use super::{Ctx, ResourcesError};
use crate::alerts::settings::{Thresholds, Webhook};
use crate::kernel::crypto;
use crate::provider::Provider;
use crate::quota::window::{Window, WindowParseError};
use crate::quota::{Metric, Mode, SubjectKind};
use crate::store::{ModelStore, Role, Store, WorkspaceStore};
use crate::upstream::fields;
use crate::validate;

/// What checking resolved, by entry index, for applying.
#[derive(Default)]
pub(super) struct Plan {
    /// Resolved policy fields.
    pub policies: Vec<(SubjectKind, Metric, Window, Mode, i64)>,
    /// Resolved providers, base URLs and served models (public name, upstream name).
    pub upstreams: Vec<(Provider, String, fields::ServedModels)>,
}

/// What the file declares so far and the database it will be applied to: the names references
/// may point at, and the keys already declared (a second declaration is refused).
struct Known<'f> {
    store: &'f Store,
    /// What the store holds of the tenancy.
    index: &'f Index,
    seen: HashSet<String>,
    workspaces: HashSet<&'f str>,
    departments: HashSet<(&'f str, &'f str)>,
    /// Member email (folded) → workspace name.
    members: HashMap<String, &'f str>,
    /// `email/name`.
    keys: HashSet<String>,
}

impl<'f> Known<'f> {
    /// Whether `key` was declared before (and notes it).
    fn declared_twice(&mut self, key: String) -> bool {
        !self.seen.insert(key)
    }

    fn workspace(&self, name: &str) -> bool {
        self.workspaces.contains(name) || self.index.workspace(name).is_some()
    }

    fn department(&self, ws: &str, name: &str) -> bool {
        self.departments.contains(&(ws, name)) || self.index.department_in(ws, name).is_some()
    }

    /// A member's workspace, from the file or the store.
    fn member_workspace(&self, email: &str) -> Option<&str> {
        if let Some(ws) = self.members.get(&crate::store::fold_email(email)) {
            return Some(ws);
        }
        self.index
            .member(email)
            .and_then(|m| self.index.workspace_name(m.workspace_id))
    }

    /// Whether the key `email/name` is declared or stored.
    fn key(&self, address: &str) -> bool {
        self.keys.contains(address)
            || address
                .split_once('/')
                .is_some_and(|(email, name)| self.index.key_at(email, name).is_some())
    }
}

/// Checks every entry, table by table in the order they depend on each other.
pub(super) async fn check(
    ctx: &Ctx<'_>,
    store: &Store,
    index: &Index,
    f: &ResourcesFile,
) -> Result<Plan, ResourcesError> {
    let mut known = Known {
        store,
        index,
        seen: HashSet::new(),
        workspaces: HashSet::new(),
        departments: HashSet::new(),
        members: HashMap::new(),
        keys: HashSet::new(),
    };
    // Every entry is checked, and every problem reported. An entry's name is known to the
    // entries after it even when the entry itself has a problem, so that one mistake is
    // reported once, not again by every entry that refers to it.
    let mut problems = Vec::new();
    for (i, w) in f.workspace.iter().enumerate() {
        problems.extend(workspace(ctx, &mut known, i, w).err());
    }
    for (i, d) in f.department.iter().enumerate() {
        problems.extend(department(ctx, &mut known, i, d).err());
    }
    for (i, m) in f.member.iter().enumerate() {
        problems.extend(member(ctx, &mut known, i, m).err());
    }
    for (i, k) in f.api_key.iter().enumerate() {
        problems.extend(api_key(ctx, &mut known, i, k).err());
    }
    let mut plan = Plan::default();
    for (i, u) in f.upstream.iter().enumerate() {
        match upstream(ctx, &mut known, i, u) {
            Ok(resolved) => plan.upstreams.push(resolved),
            Err(e) => problems.push(e),
        }
    }
    for (i, m) in f.model.iter().enumerate() {
        match model(ctx, &mut known, f, i, m).await {
            Err(e @ ResourcesError::Store(_)) => return Err(e),
            other => problems.extend(other.err()),
        }
    }
    for (i, p) in f.policy.iter().enumerate() {
        match policy(ctx, &mut known, i, p) {
            Ok(resolved) => plan.policies.push(resolved),
            Err(e) => problems.push(e),
        }
    }
    match ResourcesError::many(problems) {
        None => Ok(plan),
        Some(e) => Err(e),
    }
}

fn workspace<'f>(
    ctx: &Ctx<'_>,
    known: &mut Known<'f>,
    i: usize,
    w: &'f WorkspaceSpec,
) -> Result<(), ResourcesError> {
    let e = |m: String| ctx.entry("workspace", i, &w.name, m);
    known.workspaces.insert(&w.name);
    validate::name("name", &w.name).map_err(e)?;
    if known.declared_twice(format!("ws/{}", w.name)) {
        return Err(e(format!("workspace {:?} is declared twice", w.name)));
    }
    if let Some(tz) = &w.timezone {
        validate::timezone(tz).map_err(e)?;
    }
    Ok(())
}

fn department<'f>(
    ctx: &Ctx<'_>,
    known: &mut Known<'f>,
    i: usize,
    d: &'f DepartmentSpec,
) -> Result<(), ResourcesError> {
    let e = |m: String| ctx.entry("department", i, &d.name, m);
    let exists = known.workspace(&d.workspace);
    known.departments.insert((&d.workspace, &d.name));
    validate::name("name", &d.name).map_err(e)?;
    if !exists {
        return Err(e(format!("workspace {:?} does not exist", d.workspace)));
    }
    if known.declared_twice(format!("dept/{}/{}", d.workspace, d.name)) {
        return Err(e(format!("department {:?} is declared twice", d.name)));
    }
    Ok(())
}

fn member<'f>(
    ctx: &Ctx<'_>,
    known: &mut Known<'f>,
    i: usize,
    m: &'f MemberSpec,
) -> Result<(), ResourcesError> {
    let e = |msg: String| ctx.entry("member", i, &m.email, msg);
    let stored_elsewhere = known.index.member(&m.email).is_some_and(|existing| {
        known.index.workspace_name(existing.workspace_id) != Some(m.workspace.as_str())
    });
    let declared_before = known
        .members
        .insert(crate::store::fold_email(&m.email), &m.workspace)
        .is_some();
    validate::email(&m.email).map_err(e)?;
    m.role.parse::<Role>().map_err(e)?;
    if !known.workspace(&m.workspace) {
        return Err(e(format!("workspace {:?} does not exist", m.workspace)));
    }
    if let Some(d) = &m.department
        && !known.department(&m.workspace, d)
    {
        return Err(e(format!(
            "department {d:?} does not exist in workspace {:?}",
            m.workspace
        )));
    }
    if let Some(p) = &m.password {
        validate::password("password", p).map_err(e)?;
    }
    guardrails(&m.allowed_models, m.max_in_flight).map_err(e)?;
    if declared_before || known.declared_twice(format!("member/{}", crate::store::fold_email(&m.email))) {
        return Err(e(format!("member {:?} is declared twice", m.email)));
    }
    if stored_elsewhere {
        return Err(e(format!("{:?} already belongs to another workspace", m.email)));
    }
    Ok(())
}

fn api_key(ctx: &Ctx<'_>, known: &mut Known<'_>, i: usize, k: &ApiKeySpec) -> Result<(), ResourcesError> {
    let label = format!("{}/{}", k.member, k.name);
    let e = |m: String| ctx.entry("api_key", i, &label, m);
    known.keys.insert(label.clone());
    validate::key_name("name", &k.name).map_err(e)?;
    if known.member_workspace(&k.member).is_none() {
        return Err(e(format!("member {:?} does not exist", k.member)));
    }
    if let Some(key) = &k.key
        && !crypto::is_api_key_shape(key)
    {
        return Err(e(
            "key must be \"sk-aigw-\" followed by 32 letters or digits".into()
        ));
    }
    guardrails(&k.allowed_models, k.max_in_flight).map_err(e)?;
    if let Some(list) = &k.allowed_tags {
        crate::kernel::tags::allowed_tags("allowed_tags", list).map_err(e)?;
    }
    // A past time is accepted: the file is applied at every start, and a key that expired since
    // must not stop the gateway from starting.
    if let Some(at) = &k.expires_at {
        validate::expires_at("expires_at", at).map_err(e)?;
    }
    if known.declared_twice(format!("key/{label}")) {
        return Err(e(format!("key {label:?} is declared twice")));
    }
    Ok(())
}

/// A key's or member's guardrails beside quotas: the model allow-list and the concurrency cap.
fn guardrails(allowed_models: &Option<Vec<String>>, max_in_flight: Option<i64>) -> Result<(), String> {
    if let Some(list) = allowed_models {
        crate::auth::keys::allowed_models("allowed_models", list)?;
    }
    crate::auth::keys::max_in_flight("max_in_flight", max_in_flight)?;
    Ok(())
}

fn upstream(
    ctx: &Ctx<'_>,
    known: &mut Known<'_>,
    i: usize,
    u: &UpstreamSpec,
) -> Result<(Provider, String, fields::ServedModels), ResourcesError> {
    let e = |m: String| ctx.entry("upstream", i, &u.name, m);
    validate::name("name", &u.name).map_err(e)?;
    if !known.workspace(&u.workspace) {
        return Err(e(format!("workspace {:?} does not exist", u.workspace)));
    }
    let provider: Provider = u.provider.parse().map_err(e)?;
    let aws_keys = super::bedrock::keys(u, provider).map_err(e)?;
    let base_url = match (&u.base_url, provider.default_base_url()) {
        (Some(b), _) => fields::base_url(b).map_err(e)?,
        (None, Some(d)) => d.to_owned(),
        (None, None) if let Some(k) = &aws_keys => crate::provider::bedrock::default_base_url(&k.region),
        (None, None) => {
            return Err(e(format!(
                "base_url is required for provider {:?}",
                provider.as_str()
            )));
        }
    };
    let base_url = match (&u.api_version, provider) {
        (None, _) => base_url,
        (Some(v), Provider::Azure) => {
            crate::provider::azure::with_api_version(&base_url, Some(v)).map_err(e)?
        }
        (Some(_), _) => return Err(e("api_version is only for provider \"azure\"".into())),
    };
    let secret = if aws_keys.is_some() {
        Ok(())
    } else {
        fields::upstream_secret(&u.api_key)
    };
    secret.map_err(|m| {
        let unset = if u.api_key.is_empty() {
            " (is its ${VAR} set?)"
        } else {
            ""
        };
        e(format!("{m}{unset}"))
    })?;
    for (field, value, min) in [
        ("priority", u.priority, 0),
        ("weight", u.weight, 1),
        ("max_in_flight", u.max_in_flight, 1),
    ] {
        fields::upstream_number(field, value, min).map_err(e)?;
    }
    for (field, v) in [
        ("limits.requests_per_minute", u.limits.requests_per_minute),
        ("limits.tokens_per_minute", u.limits.tokens_per_minute),
        ("limits.requests_per_day", u.limits.requests_per_day),
    ] {
        fields::upstream_limit(field, v).map_err(e)?;
    }
    let served = fields::served_models(u.models.iter().map(ServedModelSpec::pair)).map_err(e)?;
    if known.declared_twice(format!("upstream/{}/{}", u.workspace, u.name)) {
        return Err(e(format!("upstream {:?} is declared twice", u.name)));
    }
    Ok((provider, base_url, served))
}

async fn model(
    ctx: &Ctx<'_>,
    known: &mut Known<'_>,
    f: &ResourcesFile,
    i: usize,
    m: &ModelSpec,
) -> Result<(), ResourcesError> {
    let e = |msg: String| ctx.entry("model", i, &m.name, msg);
    validate::name("name", &m.name).map_err(e)?;
    if !known.workspace(&m.workspace) {
        return Err(e(format!("workspace {:?} does not exist", m.workspace)));
    }
    if let Some(p) = &m.price {
        fields::price(p.prompt, p.completion, validate::Range::Operator).map_err(e)?;
    }
    if let Some(n) = m.max_output_tokens {
        fields::max_output_tokens(n).map_err(e)?;
    }
    fields::fallbacks(&m.name, &m.fallbacks).map_err(e)?;
    for fb in &m.fallbacks {
        // A fallback may name a declared model or one a credential of the file serves.
        let declared = f
            .model
            .iter()
            .any(|o| o.workspace == m.workspace && o.name == *fb)
            || f.upstream
                .iter()
                .any(|u| u.workspace == m.workspace && u.models.iter().any(|s| s.pair().0 == fb));
        let known = declared
            || match known.store.workspace_by_name(&m.workspace).await? {
                Some(w) => known.store.model_by_name(w.id, fb).await?.is_some(),
                None => false,
            };
        if !known {
            return Err(e(format!(
                "fallback model {fb:?} does not exist in workspace {:?}",
                m.workspace
            )));
        }
    }
    if known.declared_twice(format!("model/{}/{}", m.workspace, m.name)) {
        return Err(e(format!("model {:?} is declared twice", m.name)));
    }
    Ok(())
}

fn policy(
    ctx: &Ctx<'_>,
    known: &mut Known<'_>,
    i: usize,
    p: &PolicySpec,
) -> Result<(SubjectKind, Metric, Window, Mode, i64), ResourcesError> {
    let label = format!("{} {}", p.subject, p.target);
    let e = |m: String| ctx.entry("policy", i, &label, m);
    if !known.workspace(&p.workspace) {
        return Err(e(format!("workspace {:?} does not exist", p.workspace)));
    }
    let subject: SubjectKind = p.subject.parse().map_err(e)?;
    let metric: Metric = p.metric.parse().map_err(e)?;
    let window: Window = p
        .window
        .parse()
        .map_err(|err: WindowParseError| e(err.to_string()))?;
    let mode: Mode = p.mode.parse().map_err(e)?;
    let limit = crate::quota::policy_limit(metric, p.limit, validate::Range::Operator).map_err(e)?;
    if let Some(a) = &p.alerts {
        Thresholds::parse("alerts.at", &a.at).map_err(e)?;
        Webhook::parse("alerts.webhook", &a.webhook).map_err(e)?;
        if let Some(secret) = &a.secret {
            crate::alerts::settings::secret("alerts.secret", secret).map_err(e)?;
        }
    }
    if p.target != "*" {
        if p.department.is_some() {
            return Err(e("department only narrows target = \"*\"".into()));
        }
        let found = match subject {
            SubjectKind::Apikey => {
                if !p.target.contains('/') {
                    return Err(e(format!(
                        "apikey target {:?} must be \"member-email/key-name\"",
                        p.target
                    )));
                }
                known.key(&p.target)
            }
            SubjectKind::Member => known.member_workspace(&p.target) == Some(p.workspace.as_str()),
            SubjectKind::Dept => known.department(&p.workspace, &p.target),
            SubjectKind::Ws => p.target == p.workspace,
            // A tag value or end user is made when the policy is applied.
            SubjectKind::Tag => {
                let valid = p.target.split_once('=').is_some_and(|(k, v)| {
                    crate::kernel::tags::valid_key(k) && (v == "*" || crate::kernel::tags::valid_value(v))
                });
                if !valid {
                    return Err(e(format!(
                        "tag target {:?} must be \"key=value\", \"key=*\" or \"*\"",
                        p.target
                    )));
                }
                true
            }
            SubjectKind::EndUser => {
                if !matches!(
                    crate::kernel::tags::end_user(Some(p.target.as_bytes()), &[]),
                    Ok(Some(_))
                ) {
                    return Err(e(format!(
                        "end_user target {:?} must be 1 to 256 printable characters, or \"*\"",
                        p.target
                    )));
                }
                true
            }
        };
        if !found {
            return Err(e(format!(
                "{} {:?} does not exist in workspace {:?}",
                subject.as_str(),
                p.target,
                p.workspace
            )));
        }
    } else if let Some(d) = &p.department {
        if !matches!(subject, SubjectKind::Apikey | SubjectKind::Member) {
            return Err(e("department narrows only apikey and member policies".into()));
        }
        if !known.department(&p.workspace, d) {
            return Err(e(format!(
                "department {d:?} does not exist in workspace {:?}",
                p.workspace
            )));
        }
    }
    let key = format!(
        "policy/{}/{}/{}/{}/{}/{}",
        p.workspace,
        p.subject,
        p.target,
        p.department.as_deref().unwrap_or(""),
        p.metric,
        window
    );
    if known.declared_twice(key) {
        return Err(e("the same subject, metric and window is declared twice".into()));
    }
    Ok((subject, metric, window, mode, limit))
}
