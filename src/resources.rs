//! The resources file (DESIGN.md §8): workspaces, departments, members, keys, upstreams, models
//! and policies declared in TOML and applied idempotently at every start. It upserts by name and
//! never deletes what the console created. The whole file is checked before anything is written,
//! so a bad file changes nothing; every message names the entry (and its line).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use crate::crypto::{self, MasterKey};
use crate::managed::{Kind, Managed};
use crate::quota::window::Window;
use crate::quota::{Metric, Mode, SubjectKind, credits_to_micros};
use crate::store::{
    DepartmentStore, KeyStore, MemberStore, ModelRow, ModelStore, NewMember, PolicyRow, PolicyStore, Role,
    ServedModel, Store, StoreError, UpstreamRow, UpstreamStore, WorkspaceStore,
};
use crate::upstream::Provider;
use crate::validate;

/// A resources file that cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum ResourcesError {
    /// The file could not be read.
    #[error("cannot read resources file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the documented shape (unknown field, wrong type).
    #[error("resources file {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// An entry is invalid or refers to something that does not exist.
    #[error("resources file {path}: {entry}: {message}")]
    Entry {
        /// The file.
        path: String,
        /// Which entry, e.g. `[[api_key]] #2 (line 31, "ada@acme.test/ci")`.
        entry: String,
        /// What is wrong.
        message: String,
    },
    /// The database failed while applying.
    #[error("applying resources file: {0}")]
    Store(#[from] StoreError),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesFile {
    #[serde(default)]
    workspace: Vec<WorkspaceSpec>,
    #[serde(default)]
    department: Vec<DepartmentSpec>,
    #[serde(default)]
    member: Vec<MemberSpec>,
    #[serde(default)]
    api_key: Vec<ApiKeySpec>,
    #[serde(default)]
    upstream: Vec<UpstreamSpec>,
    #[serde(default)]
    model: Vec<ModelSpec>,
    #[serde(default)]
    policy: Vec<PolicySpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkspaceSpec {
    name: String,
    timezone: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DepartmentSpec {
    workspace: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberSpec {
    workspace: String,
    department: Option<String>,
    email: String,
    role: String,
    password: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeySpec {
    member: String,
    name: String,
    key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ServedModelSpec {
    Same(String),
    Mapped { name: String, upstream: String },
}

impl ServedModelSpec {
    /// The public name and the upstream's name.
    fn pair(&self) -> (&str, &str) {
        match self {
            ServedModelSpec::Same(n) => (n, n),
            ServedModelSpec::Mapped { name, upstream } => (name, upstream),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSpec {
    requests_per_minute: Option<i64>,
    tokens_per_minute: Option<i64>,
    requests_per_day: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamSpec {
    workspace: String,
    name: String,
    provider: String,
    base_url: Option<String>,
    api_key: String,
    #[serde(default)]
    models: Vec<ServedModelSpec>,
    #[serde(default)]
    priority: i64,
    #[serde(default = "one")]
    weight: i64,
    #[serde(default = "default_max_in_flight")]
    max_in_flight: i64,
    #[serde(default)]
    limits: LimitsSpec,
    quota_group: Option<String>,
    #[serde(default = "yes")]
    enabled: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceSpec {
    #[serde(default)]
    prompt: f64,
    #[serde(default)]
    completion: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSpec {
    workspace: String,
    name: String,
    #[serde(default)]
    fallbacks: Vec<String>,
    price: Option<PriceSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySpec {
    workspace: String,
    subject: String,
    target: String,
    /// With `target = "*"`: each subject inside this department only.
    department: Option<String>,
    metric: String,
    window: String,
    limit: f64,
    #[serde(default = "enforce")]
    mode: String,
}

fn one() -> i64 {
    1
}
fn default_max_in_flight() -> i64 {
    64
}
fn yes() -> bool {
    true
}
fn enforce() -> String {
    "enforce".to_owned()
}

/// What applying a file did, for the start-up summary.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplySummary {
    /// Entries that did not exist before.
    pub created: usize,
    /// Entries that existed and differed.
    pub updated: usize,
    /// Entries already as declared.
    pub unchanged: usize,
    /// Keys generated by this run: `(address, plaintext)`, to be printed once.
    pub generated_keys: Vec<(String, String)>,
    /// Every entity the file declares: edits to them through the admin API are undone at the
    /// next start.
    pub managed: Managed,
}

impl std::fmt::Display for ApplySummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} created, {} updated, {} unchanged",
            self.created, self.updated, self.unchanged
        )
    }
}

/// Reads, checks and applies a resources file.
pub async fn apply_file(
    store: &Store,
    master: &MasterKey,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    now: i64,
) -> Result<ApplySummary, ResourcesError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ResourcesError::Read {
        path: shown.clone(),
        source,
    })?;
    apply_text(store, master, &shown, &text, env, now).await
}

/// Checks and applies resources given as TOML text; `path` only names it in messages.
pub async fn apply_text(
    store: &Store,
    master: &MasterKey,
    path: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    now: i64,
) -> Result<ApplySummary, ResourcesError> {
    let mut file: ResourcesFile = toml::from_str(text).map_err(|e| ResourcesError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let ctx = Ctx { path, text };
    expand_file(&ctx, &mut file, env)?;
    let plan = check(&ctx, store, &file).await?;
    let mut summary = apply(store, master, &file, &plan, now).await?;
    if summary.created + summary.updated > 0 {
        store.bump_config_epoch().await?;
    }
    summary.managed = declared(store, &file, &plan).await?;
    Ok(summary)
}

/// The ids of every entity the file declares, once applied.
async fn declared(store: &Store, f: &ResourcesFile, plan: &Plan) -> Result<Managed, ResourcesError> {
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

struct Ctx<'a> {
    path: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    /// An error about the `index`th entry of `table`, naming its line in the file.
    fn entry(&self, table: &str, index: usize, label: &str, message: impl Into<String>) -> ResourcesError {
        let header = format!("[[{table}]]");
        let line = self
            .text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with(&header))
            .nth(index)
            .map(|(n, _)| n + 1);
        let entry = match line {
            Some(line) => format!("[[{table}]] #{} (line {line}, {label:?})", index + 1),
            None => format!("[[{table}]] #{} ({label:?})", index + 1),
        };
        ResourcesError::Entry {
            path: self.path.to_owned(),
            entry,
            message: message.into(),
        }
    }
}

/// `${VAR}` expansion: reads the environment; a missing variable is an error unless written
/// `${VAR:-default}`; `$${` escapes.
fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(escaped) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = escaped;
        } else if let Some(body) = after.strip_prefix("${") {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {value:?}"))?;
            // `${NAME:-default}`: the default stands in when NAME is unset or empty, as in a shell.
            let (name, default) = match body[..end].split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (&body[..end], None),
            };
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("bad variable name {name:?}"));
            }
            match (env(name), default) {
                (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => return Err(format!("environment variable {name} is not set")),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn expand_file(
    ctx: &Ctx<'_>,
    f: &mut ResourcesFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ResourcesError> {
    fn all<'s>(
        ctx: &Ctx<'_>,
        table: &str,
        i: usize,
        label: &str,
        fields: impl IntoIterator<Item = &'s mut String>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ResourcesError> {
        for field in fields {
            *field = expand(field, env).map_err(|m| ctx.entry(table, i, label, m))?;
        }
        Ok(())
    }
    for (i, w) in f.workspace.iter_mut().enumerate() {
        let label = w.name.clone();
        all(
            ctx,
            "workspace",
            i,
            &label,
            [&mut w.name].into_iter().chain(w.timezone.as_mut()),
            env,
        )?;
    }
    for (i, d) in f.department.iter_mut().enumerate() {
        let label = d.name.clone();
        all(ctx, "department", i, &label, [&mut d.workspace, &mut d.name], env)?;
    }
    for (i, m) in f.member.iter_mut().enumerate() {
        let label = m.email.clone();
        let fields = [&mut m.workspace, &mut m.email, &mut m.role]
            .into_iter()
            .chain(m.department.as_mut())
            .chain(m.password.as_mut());
        all(ctx, "member", i, &label, fields, env)?;
    }
    for (i, k) in f.api_key.iter_mut().enumerate() {
        let label = format!("{}/{}", k.member, k.name);
        all(
            ctx,
            "api_key",
            i,
            &label,
            [&mut k.member, &mut k.name].into_iter().chain(k.key.as_mut()),
            env,
        )?;
    }
    for (i, u) in f.upstream.iter_mut().enumerate() {
        let label = u.name.clone();
        let fields = [&mut u.workspace, &mut u.name, &mut u.provider, &mut u.api_key]
            .into_iter()
            .chain(u.base_url.as_mut())
            .chain(u.quota_group.as_mut());
        all(ctx, "upstream", i, &label, fields, env)?;
    }
    for (i, m) in f.model.iter_mut().enumerate() {
        let label = m.name.clone();
        all(ctx, "model", i, &label, [&mut m.workspace, &mut m.name], env)?;
    }
    for (i, p) in f.policy.iter_mut().enumerate() {
        let label = format!("{} {}", p.subject, p.target);
        all(
            ctx,
            "policy",
            i,
            &label,
            [&mut p.workspace, &mut p.target]
                .into_iter()
                .chain(p.department.as_mut()),
            env,
        )?;
    }
    Ok(())
}

/// Names the file declares, so references can be checked before anything is written.
#[derive(Default)]
struct Plan {
    /// Resolved policy fields, by entry index.
    policies: Vec<(SubjectKind, Metric, Window, Mode, i64)>,
    /// Resolved providers, base URLs and served models, by entry index.
    upstreams: Vec<(Provider, String, validate::ServedModels)>,
}

async fn check(ctx: &Ctx<'_>, store: &Store, f: &ResourcesFile) -> Result<Plan, ResourcesError> {
    let mut plan = Plan::default();
    let mut seen = HashSet::new();
    let dup = |seen: &mut HashSet<String>, key: String| !seen.insert(key);

    let mut file_ws: HashSet<&str> = HashSet::new();
    for (i, w) in f.workspace.iter().enumerate() {
        let e = |m: String| ctx.entry("workspace", i, &w.name, m);
        validate::name("name", &w.name).map_err(e)?;
        if dup(&mut seen, format!("ws/{}", w.name)) {
            return Err(e(format!("workspace {:?} is declared twice", w.name)));
        }
        if let Some(tz) = &w.timezone {
            validate::timezone(tz).map_err(e)?;
        }
        file_ws.insert(&w.name);
    }
    let ws_exists = async |name: &str| -> Result<bool, ResourcesError> {
        Ok(file_ws.contains(name) || store.workspace_by_name(name).await?.is_some())
    };

    let mut file_depts: HashSet<(&str, &str)> = HashSet::new();
    for (i, d) in f.department.iter().enumerate() {
        let e = |m: String| ctx.entry("department", i, &d.name, m);
        validate::name("name", &d.name).map_err(e)?;
        if !ws_exists(&d.workspace).await? {
            return Err(e(format!("workspace {:?} does not exist", d.workspace)));
        }
        if dup(&mut seen, format!("dept/{}/{}", d.workspace, d.name)) {
            return Err(e(format!("department {:?} is declared twice", d.name)));
        }
        file_depts.insert((&d.workspace, &d.name));
    }
    let dept_exists = async |ws: &str, name: &str| -> Result<bool, ResourcesError> {
        if file_depts.contains(&(ws, name)) {
            return Ok(true);
        }
        Ok(match store.workspace_by_name(ws).await? {
            Some(w) => store.department_by_name(w.id, name).await?.is_some(),
            None => false,
        })
    };

    let mut file_members: HashMap<&str, &str> = HashMap::new();
    for (i, m) in f.member.iter().enumerate() {
        let e = |msg: String| ctx.entry("member", i, &m.email, msg);
        validate::email(&m.email).map_err(e)?;
        m.role.parse::<Role>().map_err(e)?;
        if !ws_exists(&m.workspace).await? {
            return Err(e(format!("workspace {:?} does not exist", m.workspace)));
        }
        if let Some(d) = &m.department
            && !dept_exists(&m.workspace, d).await?
        {
            return Err(e(format!(
                "department {d:?} does not exist in workspace {:?}",
                m.workspace
            )));
        }
        if let Some(p) = &m.password {
            validate::password("password", p).map_err(e)?;
        }
        if dup(&mut seen, format!("member/{}", m.email)) {
            return Err(e(format!("member {:?} is declared twice", m.email)));
        }
        if let Some(existing) = store.member_by_email(&m.email).await? {
            let ws = store.workspace(existing.workspace_id).await?;
            if ws.as_ref().map(|w| w.name.as_str()) != Some(m.workspace.as_str()) {
                return Err(e(format!("{:?} already belongs to another workspace", m.email)));
            }
        }
        file_members.insert(&m.email, &m.workspace);
    }
    // A member's workspace, from the file or the store.
    let member_ws = async |email: &str| -> Result<Option<String>, ResourcesError> {
        if let Some(ws) = file_members.get(email) {
            return Ok(Some((*ws).to_owned()));
        }
        Ok(match store.member_by_email(email).await? {
            Some(m) => store.workspace(m.workspace_id).await?.map(|w| w.name),
            None => None,
        })
    };

    let mut file_keys: HashSet<String> = HashSet::new();
    for (i, k) in f.api_key.iter().enumerate() {
        let label = format!("{}/{}", k.member, k.name);
        let e = |m: String| ctx.entry("api_key", i, &label, m);
        validate::key_name("name", &k.name).map_err(e)?;
        if member_ws(&k.member).await?.is_none() {
            return Err(e(format!("member {:?} does not exist", k.member)));
        }
        if let Some(key) = &k.key
            && !crypto::is_api_key_shape(key)
        {
            return Err(e(
                "key must be \"sk-aigw-\" followed by 32 letters or digits".into()
            ));
        }
        if dup(&mut seen, format!("key/{label}")) {
            return Err(e(format!("key {label:?} is declared twice")));
        }
        file_keys.insert(label);
    }

    for (i, u) in f.upstream.iter().enumerate() {
        let e = |m: String| ctx.entry("upstream", i, &u.name, m);
        validate::name("name", &u.name).map_err(e)?;
        if !ws_exists(&u.workspace).await? {
            return Err(e(format!("workspace {:?} does not exist", u.workspace)));
        }
        let provider: Provider = u.provider.parse().map_err(e)?;
        let base_url = match (&u.base_url, provider.default_base_url()) {
            (Some(b), _) => validate::base_url(b).map_err(e)?,
            (None, Some(d)) => d.to_owned(),
            (None, None) => return Err(e("base_url is required for provider \"openai-compatible\"".into())),
        };
        validate::upstream_secret(&u.api_key).map_err(|m| {
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
            validate::upstream_number(field, value, min).map_err(e)?;
        }
        for (field, v) in [
            ("limits.requests_per_minute", u.limits.requests_per_minute),
            ("limits.tokens_per_minute", u.limits.tokens_per_minute),
            ("limits.requests_per_day", u.limits.requests_per_day),
        ] {
            validate::upstream_limit(field, v).map_err(e)?;
        }
        let served = validate::served_models(u.models.iter().map(ServedModelSpec::pair)).map_err(e)?;
        if dup(&mut seen, format!("upstream/{}/{}", u.workspace, u.name)) {
            return Err(e(format!("upstream {:?} is declared twice", u.name)));
        }
        plan.upstreams.push((provider, base_url, served));
    }

    let file_models: HashSet<(&str, &str)> = f
        .model
        .iter()
        .map(|m| (m.workspace.as_str(), m.name.as_str()))
        .collect();
    // A fallback may name a declared model or one a credential of the file serves.
    let file_served: HashSet<(&str, &str)> = f
        .upstream
        .iter()
        .flat_map(|u| {
            u.models.iter().map(move |sm| match sm {
                ServedModelSpec::Same(n) | ServedModelSpec::Mapped { name: n, .. } => {
                    (u.workspace.as_str(), n.as_str())
                }
            })
        })
        .collect();
    for (i, m) in f.model.iter().enumerate() {
        let e = |msg: String| ctx.entry("model", i, &m.name, msg);
        validate::name("name", &m.name).map_err(e)?;
        if !ws_exists(&m.workspace).await? {
            return Err(e(format!("workspace {:?} does not exist", m.workspace)));
        }
        if let Some(p) = &m.price {
            validate::price(p.prompt, p.completion).map_err(e)?;
        }
        validate::fallbacks(&m.name, &m.fallbacks).map_err(e)?;
        for fb in &m.fallbacks {
            let known = file_models.contains(&(m.workspace.as_str(), fb.as_str()))
                || file_served.contains(&(m.workspace.as_str(), fb.as_str()))
                || match store.workspace_by_name(&m.workspace).await? {
                    Some(w) => store.model_by_name(w.id, fb).await?.is_some(),
                    None => false,
                };
            if !known {
                return Err(e(format!(
                    "fallback model {fb:?} does not exist in workspace {:?}",
                    m.workspace
                )));
            }
        }
        if dup(&mut seen, format!("model/{}/{}", m.workspace, m.name)) {
            return Err(e(format!("model {:?} is declared twice", m.name)));
        }
    }

    for (i, p) in f.policy.iter().enumerate() {
        let label = format!("{} {}", p.subject, p.target);
        let e = |m: String| ctx.entry("policy", i, &label, m);
        if !ws_exists(&p.workspace).await? {
            return Err(e(format!("workspace {:?} does not exist", p.workspace)));
        }
        let subject: SubjectKind = p.subject.parse().map_err(e)?;
        let metric: Metric = p.metric.parse().map_err(e)?;
        let window: Window = p
            .window
            .parse()
            .map_err(|err: crate::quota::window::WindowParseError| e(err.to_string()))?;
        let mode: Mode = p.mode.parse().map_err(e)?;
        let limit = validate::policy_limit(metric, p.limit).map_err(e)?;
        if p.target != "*" {
            if p.department.is_some() {
                return Err(e("department only narrows target = \"*\"".into()));
            }
            let found = match subject {
                SubjectKind::Apikey => {
                    let (member, _) = p.target.split_once('/').ok_or_else(|| {
                        e(format!(
                            "apikey target {:?} must be \"member-email/key-name\"",
                            p.target
                        ))
                    })?;
                    file_keys.contains(&p.target)
                        || match store.member_by_email(member).await? {
                            Some(m) => store
                                .key_by_name(m.id, &p.target[member.len() + 1..])
                                .await?
                                .is_some(),
                            None => false,
                        }
                }
                SubjectKind::Member => member_ws(&p.target).await?.as_deref() == Some(p.workspace.as_str()),
                SubjectKind::Dept => dept_exists(&p.workspace, &p.target).await?,
                SubjectKind::Ws => p.target == p.workspace,
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
            if !dept_exists(&p.workspace, d).await? {
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
        if dup(&mut seen, key) {
            return Err(e("the same subject, metric and window is declared twice".into()));
        }
        plan.policies.push((subject, metric, window, mode, limit));
    }
    Ok(plan)
}

/// Counts one entry into the summary.
fn tally(summary: &mut ApplySummary, created: bool, changed: bool) {
    if created {
        summary.created += 1;
    } else if changed {
        summary.updated += 1;
    } else {
        summary.unchanged += 1;
    }
}

async fn apply(
    store: &Store,
    master: &MasterKey,
    f: &ResourcesFile,
    plan: &Plan,
    now: i64,
) -> Result<ApplySummary, ResourcesError> {
    let mut s = ApplySummary::default();
    let mut ws_ids: HashMap<String, i64> = HashMap::new();
    async fn ws_id(
        store: &Store,
        cache: &mut HashMap<String, i64>,
        name: &str,
    ) -> Result<i64, ResourcesError> {
        if let Some(id) = cache.get(name) {
            return Ok(*id);
        }
        let id = store
            .workspace_by_name(name)
            .await?
            .map(|w| w.id)
            .ok_or_else(|| StoreError::Corrupt(format!("workspace {name:?} vanished while applying")))?;
        cache.insert(name.to_owned(), id);
        Ok(id)
    }

    for w in &f.workspace {
        match store.workspace_by_name(&w.name).await? {
            None => {
                store
                    .create_workspace(&w.name, w.timezone.as_deref(), now)
                    .await?;
                tally(&mut s, true, false);
            }
            Some(existing) => {
                let changed = existing.timezone != w.timezone;
                if changed {
                    store
                        .set_workspace_timezone(existing.id, w.timezone.as_deref())
                        .await?;
                }
                tally(&mut s, false, changed);
            }
        }
    }
    for d in &f.department {
        let ws = ws_id(store, &mut ws_ids, &d.workspace).await?;
        let exists = store.department_by_name(ws, &d.name).await?.is_some();
        if !exists {
            store.create_department(ws, &d.name, now).await?;
        }
        tally(&mut s, !exists, false);
    }
    for m in &f.member {
        let ws = ws_id(store, &mut ws_ids, &m.workspace).await?;
        let dept = match &m.department {
            Some(d) => store.department_by_name(ws, d).await?.map(|d| d.id),
            None => None,
        };
        match store.member_by_email(&m.email).await? {
            None => {
                let hash = m.password.as_deref().map(crypto::hash_password);
                let new = NewMember {
                    workspace_id: ws,
                    department_id: dept,
                    email: &m.email,
                    role: &m.role,
                    password_hash: hash.as_deref(),
                };
                store.create_member(&new, now).await?;
                tally(&mut s, true, false);
            }
            Some(existing) => {
                let mut changed = false;
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
                tally(&mut s, false, changed);
            }
        }
    }
    for k in &f.api_key {
        let member = store
            .member_by_email(&k.member)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("member {:?} vanished while applying", k.member)))?;
        match store.key_by_name(member.id, &k.name).await? {
            None => {
                let plain = match &k.key {
                    Some(key) => key.clone(),
                    None => {
                        let key = crypto::generate_api_key();
                        s.generated_keys
                            .push((format!("{}/{}", k.member, k.name), key.clone()));
                        key
                    }
                };
                store
                    .create_key(
                        member.workspace_id,
                        member.id,
                        Some(member.id),
                        &k.name,
                        &crypto::hash_api_key(&plain),
                        &crypto::display_prefix(&plain),
                        now,
                    )
                    .await?;
                tally(&mut s, true, false);
            }
            Some(existing) => {
                let new_hash = k.key.as_deref().map(crypto::hash_api_key);
                let changed = new_hash.as_ref().is_some_and(|h| *h != existing.key_hash);
                if let (true, Some(h), Some(plain)) = (changed, &new_hash, &k.key) {
                    store
                        .set_key_hash(existing.id, h, &crypto::display_prefix(plain))
                        .await?;
                }
                tally(&mut s, false, changed);
            }
        }
    }
    for (u, (provider, base_url, served)) in f.upstream.iter().zip(&plan.upstreams) {
        let ws = ws_id(store, &mut ws_ids, &u.workspace).await?;
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
            Some(e) if master.open(&e.secret_sealed).ok().as_deref() == Some(u.api_key.as_str()) => {
                e.secret_sealed.clone()
            }
            _ => master.seal(&u.api_key),
        };
        let mut row = UpstreamRow {
            id: existing.as_ref().map_or(0, |e| e.id),
            workspace_id: ws,
            name: u.name.clone(),
            provider: provider.as_str().to_owned(),
            base_url: base_url.clone(),
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
        tally(&mut s, existing.is_none(), changed);
    }
    for m in &f.model {
        let ws = ws_id(store, &mut ws_ids, &m.workspace).await?;
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
        tally(&mut s, existing.is_none(), changed);
    }
    for (p, (subject, metric, window, mode, limit)) in f.policy.iter().zip(&plan.policies) {
        let ws = ws_id(store, &mut ws_ids, &p.workspace).await?;
        let target_id = resolve_target(store, ws, *subject, &p.target).await?;
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
            limit_value: *limit,
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
        tally(&mut s, existing.is_none(), changed);
    }
    Ok(s)
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

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn expansion() {
        let env = |k: &str| match k {
            "A" => Some("alpha".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("plain", Ok("plain")),
            ("${A}", Ok("alpha")),
            ("x-${A}-${A}", Ok("x-alpha-alpha")),
            ("${EMPTY}", Ok("")),
            ("cost $5", Ok("cost $5")),
            ("$${A}", Ok("${A}")),
            ("${MISSING}", Err("environment variable MISSING is not set")),
            ("${A", Err("unclosed")),
            ("${A B}", Err("bad variable name")),
            ("${MISSING:-18080}", Ok("18080")),
            ("${A:-18080}", Ok("alpha")),
            ("${EMPTY:-d}", Ok("d")),
            ("${MISSING:-}", Ok("")),
            ("http://h:${MISSING:-1}/v1", Ok("http://h:1/v1")),
            ("${MISSING:-a:-b}", Ok("a:-b")),
            ("${:-x}", Err("bad variable name")),
        ];
        for (input, want) in cases {
            match (expand(input, &env), want) {
                (Ok(got), Ok(w)) => assert_eq!(&got, w, "{input}"),
                (Err(got), Err(w)) => assert!(got.contains(w), "{input}: {got}"),
                (got, w) => panic!("{input}: got {got:?}, want {w:?}"),
            }
        }
    }
}
