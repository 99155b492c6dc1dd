//! Guardrail quota policies (DESIGN.md §4) through the admin API, with who may set what:
//! the owner any policy; an admin budgets on keys and limits on members whose role is `member`
//! (no guardrail above its own); a member budgets on the keys they created, never on another's.
//!
//! A policy records who last set it (`created_by`; none for the resources file). A member reads
//! every budget on the keys they created but changes or deletes only the ones they set
//! themselves: a limit an owner or admin put over them (or the file declares) is theirs to keep.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::policy_names::Names;
use super::session::Actor;
use super::{
    AdminResult, Body, Id, Page, Params, audit, config_changed, created, no_content, page_of, store_error,
};
use crate::error::ApiError;
use crate::kernel::managed::Kind;
use crate::quota::engine::{PolicyRule, display_value};
use crate::quota::window::{Window, format_reset_at};
use crate::quota::{Metric, Mode, SubjectKind};
use crate::state::AppState;
use crate::store::{AdminStore, AlertStore, PolicyRow, PolicyStore, Role, Table};

/// Whether `actor` may set a policy of `p`'s kind and target: the access rule of the subject.
fn may_target(actor: &Actor, names: &Names, p: &PolicyRow) -> bool {
    match actor.role() {
        Role::Owner => true,
        Role::Admin => match p.subject.as_str() {
            "apikey" => p.target_id != 0,
            "member" => names
                .member(p.target_id)
                .is_some_and(|m| m.role() == Role::Member),
            _ => false,
        },
        Role::Member => {
            p.subject == "apikey"
                && names
                    .key(p.target_id)
                    .is_some_and(|k| k.created_by == Some(actor.member.id))
        }
    }
}

/// Whether `actor` may change or delete policy `p` as stored: its target is theirs to set and,
/// for a member, they set it themselves (DESIGN §3: a member sets budgets, it does not lift the
/// limits set over it).
fn may_manage(actor: &Actor, names: &Names, p: &PolicyRow) -> bool {
    may_target(actor, names, p) && (actor.role() != Role::Member || p.created_by == Some(actor.member.id))
}

/// Whether `actor` may read policy `p`: managers read every policy of the workspace, a member
/// every budget on the keys they created and on themself.
fn may_read(actor: &Actor, names: &Names, p: &PolicyRow) -> bool {
    let on_self = p.subject == "member" && p.target_id == actor.member.id;
    actor.manages() || on_self || may_target(actor, names, p)
}

/// Why `actor` may read policy `p` but not change or delete it (`change` names the action).
fn read_only(actor: &Actor, change: &str) -> ApiError {
    ApiError::Forbidden {
        message: match actor.role() {
            Role::Member => {
                format!("this policy was set by an owner or admin; only an owner or admin can {change} it")
            }
            _ => format!("you may read this policy but not {change} it"),
        },
    }
}

async fn policy_json(state: &AppState, names: &Names, p: &PolicyRow) -> AdminResult<Value> {
    let metric: Metric = p.metric.parse().unwrap_or(Metric::Requests);
    let mut v = json!({
        "id": p.id,
        "subject": p.subject,
        "target_id": (p.target_id != 0).then_some(p.target_id),
        "target": names.label(p),
        "department_id": (p.scope_department_id != 0).then_some(p.scope_department_id),
        "metric": p.metric,
        "window": p.time_window,
        "limit": display_value(metric, p.limit_value),
        "mode": p.mode,
        "used": null,
        "remaining": null,
        "reset_at": null,
        "window_end": null,
        "created_by": p.created_by,
        "created_at": p.created_at,
        "updated_at": p.updated_at,
        "managed_by": state.managed.by(Kind::Policy, p.id),
        "alerts": super::alerts::json_of(state, p.id),
    });
    // One named subject has one counter to show; "each" (and every value of a tag key) has one
    // per subject.
    if let Some(rule) = PolicyRule::from_row(p).filter(|r| r.target_id != 0 && !names.labels.is_each_value(r))
    {
        let tz = state.timezone_of(p.workspace_id);
        let s = state
            .quota
            .standing(&state.store, &rule, rule.target_id, state.clock.now(), tz)
            .await
            .map_err(store_error)?;
        v["used"] = display_value(metric, s.used);
        v["remaining"] = display_value(metric, s.remaining(0));
        v["reset_at"] = json!(s.reset_at.as_ref().map(format_reset_at));
        v["window_end"] = json!(super::window_end(&s, tz));
    }
    Ok(v)
}

/// `GET /admin/v1/policies`: every policy the actor may read, with current usage.
pub async fn list(State(state): State<AppState>, actor: Actor, Params(page): Params<Page>) -> AdminResult {
    let (after, limit) = page.bounds()?;
    let ws = actor.workspace_id();
    let rows: Vec<PolicyRow> = state
        .store
        .page_in(Table::Policies, ws, after, limit + 1)
        .await
        .map_err(store_error)?;
    let (rows, next_cursor) = page_of(rows, limit, |p| p.id);
    let names = Names::of_policies(&state, ws, &rows).await?;
    let mut data = Vec::new();
    for p in rows.iter().filter(|p| may_read(&actor, &names, p)) {
        let mut v = policy_json(&state, &names, p).await?;
        super::alerts::redact(&actor, &mut v);
        data.push(v);
    }
    Ok(Json(json!({ "data": data, "next_cursor": next_cursor })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandingsQuery {
    /// The least share of its limit a subject must have used, in percent; default 80.
    #[serde(default)]
    min_percent: Option<f64>,
}

/// `GET /admin/v1/quota/standings`: every quota of the workspace that a subject has used at
/// least `min_percent` of, one entry per policy and subject (an "each" policy per member, key
/// or department), fullest first: what the console's overview lists as needing attention.
pub async fn standings(
    State(state): State<AppState>,
    actor: Actor,
    Params(q): Params<StandingsQuery>,
) -> AdminResult {
    let min_percent = q.min_percent.unwrap_or(80.0);
    if !(0.0..=100.0).contains(&min_percent) {
        return Err(ApiError::field(
            "min_percent",
            "min_percent must be between 0 and 100",
        ));
    }
    let ws = actor.workspace_id();
    let mut names = Names::load(&state, ws).await?;
    let rows: Vec<PolicyRow> = state
        .store
        .rows_in(Table::Policies, ws)
        .await
        .map_err(store_error)?;
    let (now, tz) = (state.clock.now(), state.timezone_of(ws));
    let mut found: Vec<(f64, Value)> = Vec::new();
    for rule in rows.iter().filter_map(PolicyRule::from_row) {
        let all = state
            .quota
            .standings_of_all(&state.store, &rule, now, tz)
            .await
            .map_err(store_error)?;
        names
            .labels
            .learn(&state, ws, rule.subject, all.iter().map(|s| s.key.subject_id))
            .await?;
        for s in all.iter().filter(|s| names.covers(&rule, s.key.subject_id)) {
            // A limit of 0 refuses everything: it is full.
            let percent = if rule.limit > 0 {
                s.used as f64 * 100.0 / rule.limit as f64
            } else {
                100.0
            };
            let Some(subject_name) = names.subject_name(rule.subject, s.key.subject_id) else {
                continue;
            };
            if percent < min_percent {
                continue;
            }
            found.push((
                percent,
                json!({
                    "policy_id": rule.id,
                    "subject": rule.subject.as_str(),
                    "subject_id": s.key.subject_id,
                    "subject_name": subject_name,
                    "each": rule.target_id == 0,
                    "metric": rule.metric.as_str(),
                    "window": rule.window.to_string(),
                    "limit": display_value(rule.metric, rule.limit),
                    "used": display_value(rule.metric, s.used),
                    "remaining": display_value(rule.metric, s.remaining(0)),
                    "percent": (percent * 10.0).round() / 10.0,
                    "mode": rule.mode.as_str(),
                    "reset_at": s.reset_at.as_ref().map(format_reset_at),
                    "window_end": super::window_end(s, tz),
                }),
            ));
        }
    }
    found.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| a.1["subject_name"].as_str().cmp(&b.1["subject_name"].as_str()))
    });
    let data: Vec<Value> = found.into_iter().map(|(_, v)| v).collect();
    Ok(Json(json!({ "min_percent": min_percent, "data": data })).into_response())
}

async fn visible(state: &AppState, actor: &Actor, names: &Names, id: i64) -> AdminResult<PolicyRow> {
    let p: Option<PolicyRow> = state
        .store
        .row_in(Table::Policies, actor.workspace_id(), id)
        .await
        .map_err(store_error)?;
    p.filter(|p| may_read(actor, names, p))
        .ok_or(ApiError::NotFound { what: "policy" })
}

/// `GET /admin/v1/policies/{id}`.
pub async fn get(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let names = Names::load(&state, actor.workspace_id()).await?;
    let p = visible(&state, &actor, &names, id).await?;
    let mut v = policy_json(&state, &names, &p).await?;
    super::alerts::redact(&actor, &mut v);
    Ok(Json(v).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewPolicy {
    subject: String,
    /// The one subject; null or absent: each subject of that kind.
    #[serde(default)]
    target_id: Option<i64>,
    /// For `tag`: `key=value`, `key=*` (each value of the key) or `*` (each value of every
    /// key); for `end_user`: the end user's id or `*`. Null or absent: `*`.
    #[serde(default)]
    target: Option<String>,
    /// With "each": only inside this department.
    #[serde(default)]
    department_id: Option<i64>,
    metric: String,
    window: String,
    limit: f64,
    #[serde(default)]
    mode: Option<String>,
    /// Budget alerts: thresholds and webhook.
    #[serde(default)]
    alerts: Option<super::alerts::AlertsInput>,
}

fn parse_limit(metric: Metric, limit: f64) -> AdminResult<i64> {
    super::checked(
        "limit",
        crate::quota::policy_limit(metric, limit, crate::validate::Range::Console),
    )
}

fn parse_mode(mode: Option<&str>) -> AdminResult<Mode> {
    mode.unwrap_or("enforce")
        .parse()
        .map_err(|m: String| ApiError::field("mode", m))
}

/// `POST /admin/v1/policies`.
pub async fn create(State(state): State<AppState>, actor: Actor, Body(req): Body<NewPolicy>) -> AdminResult {
    let subject: SubjectKind = req
        .subject
        .parse()
        .map_err(|m: String| ApiError::field("subject", m))?;
    let metric: Metric = req
        .metric
        .parse()
        .map_err(|m: String| ApiError::field("metric", m))?;
    let window: Window = req
        .window
        .parse()
        .map_err(|e: crate::quota::window::WindowParseError| ApiError::field("window", e.to_string()))?;
    let limit = parse_limit(metric, req.limit)?;
    let mode = parse_mode(req.mode.as_deref())?;
    let ws = actor.workspace_id();
    let alerts = match &req.alerts {
        Some(input) => {
            super::alerts::may_set(&actor)?;
            Some(super::alerts::settings(&state, ws, 0, input, None)?)
        }
        None => None,
    };
    let mut names = Names::load(&state, ws).await?;
    let target_id = match (subject, req.target_id) {
        (SubjectKind::Tag | SubjectKind::EndUser, target_id) => {
            names
                .labels
                .target(&state, ws, subject, target_id, req.target.as_deref())
                .await?
        }
        (_, _) if req.target.is_some() => {
            return Err(ApiError::field(
                "target",
                "target names a tag or an end user; other subjects take target_id",
            ));
        }
        // The workspace is one subject whichever way it is named.
        (SubjectKind::Ws, None) => ws,
        (_, None) => 0,
        (_, Some(id)) => id,
    };
    if target_id != 0 {
        if req.department_id.is_some() {
            return Err(ApiError::field(
                "department_id",
                "department_id only narrows \"each\" (target_id null)",
            ));
        }
        let exists = match subject {
            SubjectKind::Apikey => names
                .key(target_id)
                .is_some_and(|k| actor.manages() || k.created_by == Some(actor.member.id)),
            SubjectKind::Member => names.member(target_id).is_some(),
            SubjectKind::Dept => names.department(target_id).is_some(),
            SubjectKind::Ws => target_id == ws,
            SubjectKind::Tag | SubjectKind::EndUser => names.labels.name(subject, target_id).is_some(),
        };
        if !exists {
            return Err(ApiError::field(
                "target_id",
                format!(
                    "{} {target_id} does not exist in this workspace",
                    subject.as_str()
                ),
            ));
        }
    } else if let Some(d) = req.department_id {
        if !matches!(subject, SubjectKind::Apikey | SubjectKind::Member) {
            return Err(ApiError::field(
                "department_id",
                "department_id narrows only apikey and member policies",
            ));
        }
        if names.department(d).is_none() {
            return Err(ApiError::field(
                "department_id",
                format!("department {d} does not exist in this workspace"),
            ));
        }
    }
    let now = state.clock.now_ms();
    let mut row = PolicyRow {
        id: 0,
        workspace_id: ws,
        subject: subject.as_str().to_owned(),
        target_id,
        scope_department_id: req.department_id.unwrap_or(0),
        metric: metric.as_str().to_owned(),
        time_window: window.to_string(),
        limit_value: limit,
        mode: mode.as_str().to_owned(),
        created_by: Some(actor.member.id),
        created_at: now,
        updated_at: now,
    };
    if !may_target(&actor, &names, &row) {
        return Err(ApiError::Forbidden {
            message: match actor.role() {
                Role::Member => "a member sets budgets only on the API keys they created".into(),
                _ => "an admin sets policies only on API keys and on members whose role is member; \
                      department, workspace and \"each\" guardrails are the owner's"
                    .into(),
            },
        });
    }
    // DESIGN.md §11: the usage recorded in this window counts, before any gateway applies it.
    let counted = state.count_recorded(&row).await.map_err(store_error)?;
    row.id = state.store.save_policy(&row).await.map_err(store_error)?;
    if let Some(mut a) = alerts {
        a.policy_id = row.id;
        state
            .store
            .set_policy_alerts(row.id, Some(&a))
            .await
            .map_err(store_error)?;
    }
    config_changed(&state).await?;
    let mut body = policy_json(&state, &names, &row).await?;
    audit(
        &state,
        &actor,
        "create",
        "policy",
        row.id,
        None,
        Some(body.clone()),
    )
    .await;
    body["counted_before"] = counted.json(metric);
    Ok(created(body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPatch {
    #[serde(default)]
    limit: Option<f64>,
    #[serde(default)]
    mode: Option<String>,
    /// Absent: unchanged; null: no alerts; an object: these alerts.
    #[serde(default, with = "super::double_option")]
    alerts: Option<Option<super::alerts::AlertsInput>>,
}

/// `PATCH /admin/v1/policies/{id}` `{limit?, mode?}`: usage is kept (counters belong to the
/// subject, metric and window, not to the policy); a limit below current usage refuses at once.
pub async fn update(
    State(state): State<AppState>,
    actor: Actor,
    Id(id): Id,
    Body(req): Body<PolicyPatch>,
) -> AdminResult {
    let names = Names::load(&state, actor.workspace_id()).await?;
    let before = visible(&state, &actor, &names, id).await?;
    if !may_manage(&actor, &names, &before) {
        return Err(read_only(&actor, "change"));
    }
    let metric: Metric = before.metric.parse().unwrap_or(Metric::Requests);
    let mut after = before.clone();
    if let Some(limit) = req.limit {
        after.limit_value = parse_limit(metric, limit)?;
    }
    if req.mode.is_some() {
        after.mode = parse_mode(req.mode.as_deref())?.as_str().to_owned();
    }
    let alerts = match &req.alerts {
        None => None,
        Some(input) => {
            super::alerts::may_set(&actor)?;
            Some(match input {
                Some(i) => {
                    let ws = before.workspace_id;
                    let secret = super::alerts::current_secret(&state, ws, id).await?;
                    Some(super::alerts::settings(&state, ws, id, i, secret)?)
                }
                None => None,
            })
        }
    };
    let before_json = policy_json(&state, &names, &before).await?;
    after.updated_at = state.clock.now_ms();
    // The limit is now this actor's: one an owner or admin changed is read-only to the member.
    after.created_by = Some(actor.member.id);
    state.store.save_policy(&after).await.map_err(store_error)?;
    if let Some(a) = &alerts {
        state
            .store
            .set_policy_alerts(id, a.as_ref())
            .await
            .map_err(store_error)?;
    }
    config_changed(&state).await?;
    let after_json = policy_json(&state, &names, &after).await?;
    audit(
        &state,
        &actor,
        "update",
        "policy",
        id,
        Some(before_json),
        Some(after_json.clone()),
    )
    .await;
    Ok(Json(after_json).into_response())
}

/// `DELETE /admin/v1/policies/{id}`: usage counters stay (a policy recreated later sees them).
pub async fn delete(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let names = Names::load(&state, actor.workspace_id()).await?;
    let before = visible(&state, &actor, &names, id).await?;
    if !may_manage(&actor, &names, &before) {
        return Err(read_only(&actor, "delete"));
    }
    let before_json = policy_json(&state, &names, &before).await?;
    state
        .store
        .delete_in(Table::Policies, actor.workspace_id(), id)
        .await
        .map_err(store_error)?;
    config_changed(&state).await?;
    audit(&state, &actor, "delete", "policy", id, Some(before_json), None).await;
    Ok(no_content())
}
