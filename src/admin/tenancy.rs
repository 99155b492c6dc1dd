//! The workspace, its departments and its members.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{
    AdminResult, Body, Id, Page, Params, audit, checked, config_changed, created, delete_policies,
    double_option, name_field, no_content, page_of, store_error,
};
use crate::error::ApiError;
use crate::kernel::crypto;
use crate::kernel::managed::Kind;
use crate::state::AppState;
use crate::store::{
    AdminStore, Department, DepartmentStore, MemberRow, MemberStore, NewMember, Role, Table, WorkspaceStore,
};
use crate::validate;

/// `GET /admin/v1/workspace`.
pub async fn workspace(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let ws = state
        .store
        .workspace(actor.workspace_id())
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "workspace" })?;
    Ok(Json(workspace_json(&state, &ws)).into_response())
}

fn workspace_json(state: &AppState, ws: &crate::store::Workspace) -> Value {
    json!({
        "id": ws.id,
        "name": ws.name,
        "timezone": ws.timezone,
        "effective_timezone": state.timezone_of(ws.id).name(),
        "created_at": ws.created_at,
        "managed_by": state.managed.by(Kind::Workspace, ws.id),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspacePatch {
    /// An IANA zone, or null for the gateway's; absent keeps the current one.
    #[serde(default, with = "double_option")]
    timezone: Option<Option<String>>,
}

/// `PATCH /admin/v1/workspace` `{timezone}` (owner): the zone quota windows align to.
pub async fn update_workspace(
    State(state): State<AppState>,
    actor: Actor,
    Body(req): Body<WorkspacePatch>,
) -> AdminResult {
    let Some(timezone) = req.timezone else {
        return workspace(State(state), actor).await;
    };
    if let Some(tz) = &timezone {
        checked("timezone", validate::timezone(tz))?;
    }
    let store = &state.store;
    let before = store.workspace(actor.workspace_id()).await.map_err(store_error)?;
    store
        .set_workspace_timezone(actor.workspace_id(), timezone.as_deref())
        .await
        .map_err(store_error)?;
    config_changed(&state).await?;
    let after = store
        .workspace(actor.workspace_id())
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "workspace" })?;
    let after_json = workspace_json(&state, &after);
    audit(
        &state,
        &actor,
        "update",
        "workspace",
        after.id,
        before.map(|w| json!({"timezone": w.timezone})),
        Some(json!({"timezone": after.timezone})),
    )
    .await;
    Ok(Json(after_json).into_response())
}

fn department_json(state: &AppState, d: &Department) -> Value {
    json!({
        "id": d.id,
        "name": d.name,
        "created_at": d.created_at,
        "managed_by": state.managed.by(Kind::Department, d.id),
    })
}

/// `GET /admin/v1/departments`.
pub async fn departments(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let rows: Vec<Department> = state
        .store
        .rows_in(Table::Departments, actor.workspace_id())
        .await
        .map_err(store_error)?;
    Ok(
        Json(json!({"data": rows.iter().map(|d| department_json(&state, d)).collect::<Vec<_>>()}))
            .into_response(),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepartmentInput {
    name: String,
}

/// `POST /admin/v1/departments` `{name}`.
pub async fn create_department(
    State(state): State<AppState>,
    actor: Actor,
    Body(req): Body<DepartmentInput>,
) -> AdminResult {
    let name = name_field("name", &req.name)?;
    let d = state
        .store
        .create_department(actor.workspace_id(), &name, state.clock.now_ms())
        .await
        .map_err(store_error)?;
    audit(
        &state,
        &actor,
        "create",
        "department",
        d.id,
        None,
        Some(department_json(&state, &d)),
    )
    .await;
    Ok(created(department_json(&state, &d)))
}

/// `PATCH /admin/v1/departments/{id}` `{name}`.
pub async fn update_department(
    State(state): State<AppState>,
    actor: Actor,
    Id(id): Id,
    Body(req): Body<DepartmentInput>,
) -> AdminResult {
    let name = name_field("name", &req.name)?;
    let before: Department = department(&state, &actor, id).await?;
    state
        .store
        .rename_department(id, &name)
        .await
        .map_err(store_error)?;
    let after = department(&state, &actor, id).await?;
    audit(
        &state,
        &actor,
        "update",
        "department",
        id,
        Some(department_json(&state, &before)),
        Some(department_json(&state, &after)),
    )
    .await;
    Ok(Json(department_json(&state, &after)).into_response())
}

/// `DELETE /admin/v1/departments/{id}`: its members stay, without a department; its policies go.
pub async fn delete_department(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let before = department(&state, &actor, id).await?;
    let store = &state.store;
    // Policies on the department (as the one subject, or narrowing "each") would name a
    // department that no longer exists: they go with it.
    delete_policies(&state, actor.workspace_id(), |p| {
        (p.subject == "dept" && p.target_id == id) || p.scope_department_id == id
    })
    .await?;
    store
        .delete_in(Table::Departments, actor.workspace_id(), id)
        .await
        .map_err(store_error)?;
    config_changed(&state).await?;
    audit(
        &state,
        &actor,
        "delete",
        "department",
        id,
        Some(department_json(&state, &before)),
        None,
    )
    .await;
    Ok(no_content())
}

async fn department(state: &AppState, actor: &Actor, id: i64) -> AdminResult<Department> {
    state
        .store
        .row_in(Table::Departments, actor.workspace_id(), id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "department" })
}

/// A member as the API shows it (never the password hash).
pub fn member_json(state: &AppState, m: &MemberRow) -> Value {
    json!({
        "id": m.id,
        "email": m.email,
        "role": m.role,
        "department_id": m.department_id,
        "active": m.active == 1,
        "allowed_models": super::keys::stored_models(m.allowed_models.as_deref()),
        "max_in_flight": m.max_in_flight,
        "key_limits": {
            "allowed_models": super::keys::stored_models(m.key_allowed_models.as_deref()),
            "max_in_flight": m.key_max_in_flight,
            "allowed_tags": super::keys::stored_models(m.key_allowed_tags.as_deref()),
        },
        "created_at": m.created_at,
        "managed_by": state.managed.by(Kind::Member, m.id),
    })
}

/// `GET /admin/v1/members`.
pub async fn members(State(state): State<AppState>, actor: Actor, Params(page): Params<Page>) -> AdminResult {
    let (after, limit) = page.bounds()?;
    let rows: Vec<MemberRow> = state
        .store
        .page_in(Table::Members, actor.workspace_id(), after, limit + 1)
        .await
        .map_err(store_error)?;
    let (rows, next_cursor) = page_of(rows, limit, |m| m.id);
    let data: Vec<Value> = rows.iter().map(|m| member_json(&state, m)).collect();
    Ok(Json(json!({ "data": data, "next_cursor": next_cursor })).into_response())
}

async fn member_in(state: &AppState, actor: &Actor, id: i64) -> AdminResult<MemberRow> {
    state
        .store
        .row_in(Table::Members, actor.workspace_id(), id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "member" })
}

/// `GET /admin/v1/members/{id}`.
pub async fn member(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    Ok(Json(member_json(&state, &member_in(&state, &actor, id).await?)).into_response())
}

/// Only the owner grants or changes the owner role; an admin manages admins and members.
fn may_assign(actor: &Actor, from: Option<Role>, to: Role) -> AdminResult<()> {
    if actor.role() == Role::Owner {
        return Ok(());
    }
    if to == Role::Owner || from == Some(Role::Owner) {
        return Err(ApiError::Forbidden {
            message: "only the owner may grant, change or deactivate the owner role".into(),
        });
    }
    Ok(())
}

async fn check_department(state: &AppState, actor: &Actor, id: Option<i64>) -> AdminResult<()> {
    if let Some(d) = id {
        let found: Option<Department> = state
            .store
            .row_in(Table::Departments, actor.workspace_id(), d)
            .await
            .map_err(store_error)?;
        if found.is_none() {
            return Err(ApiError::field(
                "department_id",
                format!("department {d} does not exist in this workspace"),
            ));
        }
    }
    Ok(())
}

fn parse_role(role: &str) -> AdminResult<Role> {
    role.parse().map_err(|m: String| ApiError::field("role", m))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invite {
    email: String,
    role: String,
    #[serde(default)]
    department_id: Option<i64>,
    /// The public models the member's keys may call; null: every model.
    #[serde(default)]
    allowed_models: Option<Vec<String>>,
    /// The most requests the member's keys together may have in flight on one gateway.
    #[serde(default)]
    max_in_flight: Option<i64>,
}

/// `POST /admin/v1/members` `{email, role, department_id?, allowed_models?, max_in_flight?}`: invites a member with a one-time
/// password, shown in this answer only.
pub async fn invite_member(
    State(state): State<AppState>,
    actor: Actor,
    Body(req): Body<Invite>,
) -> AdminResult {
    let email = checked("email", validate::email(req.email.trim()))?;
    let role = parse_role(&req.role)?;
    may_assign(&actor, None, role)?;
    let (allowed_models, max_in_flight) =
        super::keys::guardrails(Some(req.allowed_models), Some(req.max_in_flight), (None, None))?;
    if allowed_models.is_some() || max_in_flight.is_some() {
        may_guard(&actor, role)?;
    }
    check_department(&state, &actor, req.department_id).await?;
    if state
        .store
        .member_by_email(email)
        .await
        .map_err(store_error)?
        .is_some()
    {
        return Err(ApiError::Conflict {
            message: format!("a member with the email {email:?} already exists"),
        });
    }
    let password = crypto::generate_password();
    let hash = one_time_password_hash(&password).await?;
    let mut m = state
        .store
        .create_member(
            &NewMember {
                workspace_id: actor.workspace_id(),
                department_id: req.department_id,
                email,
                role: role.as_str(),
                password_hash: Some(&hash),
            },
            state.clock.now_ms(),
        )
        .await
        .map_err(store_error)?;
    if allowed_models.is_some() || max_in_flight.is_some() {
        state
            .store
            .set_member_guardrails(m.id, allowed_models.as_deref(), max_in_flight)
            .await
            .map_err(store_error)?;
        (m.allowed_models, m.max_in_flight) = (allowed_models, max_in_flight);
    }
    config_changed(&state).await?;
    audit(
        &state,
        &actor,
        "create",
        "member",
        m.id,
        None,
        Some(member_json(&state, &m)),
    )
    .await;
    let mut body = member_json(&state, &m);
    body["one_time_password"] = json!(password);
    Ok(created(body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberPatch {
    #[serde(default)]
    role: Option<String>,
    /// `null` removes the department; absent keeps it.
    #[serde(default, with = "double_option")]
    department_id: Option<Option<i64>>,
    #[serde(default)]
    active: Option<bool>,
    /// A list, or null for every model; absent keeps the current one.
    #[serde(default, with = "double_option")]
    allowed_models: Option<Option<Vec<String>>>,
    /// A cap, or null for none; absent keeps the current one.
    #[serde(default, with = "double_option")]
    max_in_flight: Option<Option<i64>>,
}

/// Only the owner sets the guardrails of owners and admins; an admin those of members (as with
/// member quotas).
fn may_guard(actor: &Actor, role: Role) -> AdminResult<()> {
    if actor.role() != Role::Owner && role != Role::Member {
        return Err(ApiError::Forbidden {
            message: "only the owner sets allowed models or max_in_flight on owners and admins".into(),
        });
    }
    Ok(())
}

/// `PATCH /admin/v1/members/{id}` `{role?, department_id?, active?, allowed_models?,
/// max_in_flight?}`. Deactivating signs the member out and stops their keys; the last active
/// owner cannot be demoted or deactivated.
pub async fn update_member(
    State(state): State<AppState>,
    actor: Actor,
    Id(id): Id,
    Body(req): Body<MemberPatch>,
) -> AdminResult {
    let before = member_in(&state, &actor, id).await?;
    let role = match &req.role {
        Some(r) => parse_role(r)?,
        None => before.role(),
    };
    may_assign(&actor, Some(before.role()), role)?;
    if req.active == Some(false) && before.role() == Role::Owner {
        may_assign(&actor, Some(Role::Owner), Role::Owner)?;
    }
    let department_id = match req.department_id {
        Some(d) => {
            check_department(&state, &actor, d).await?;
            d
        }
        None => before.department_id,
    };
    let losing_owner = before.role() == Role::Owner
        && before.active == 1
        && (role != Role::Owner || req.active == Some(false));
    if losing_owner && owners_in(&state, actor.workspace_id()).await? <= 1 {
        return Err(ApiError::Conflict {
            message: "the workspace's last active owner cannot be demoted or deactivated".into(),
        });
    }
    let guarded = req.allowed_models.is_some() || req.max_in_flight.is_some();
    if guarded {
        may_guard(&actor, before.role())?;
    }
    let (allowed_models, max_in_flight) = super::keys::guardrails(
        req.allowed_models,
        req.max_in_flight,
        (before.allowed_models.clone(), before.max_in_flight),
    )?;
    let store = &state.store;
    store
        .update_member(id, department_id, role.as_str())
        .await
        .map_err(store_error)?;
    if guarded {
        store
            .set_member_guardrails(id, allowed_models.as_deref(), max_in_flight)
            .await
            .map_err(store_error)?;
    }
    if let Some(active) = req.active
        && active != (before.active == 1)
    {
        store.set_member_active(id, active).await.map_err(store_error)?;
    }
    config_changed(&state).await?;
    let after = member_in(&state, &actor, id).await?;
    audit(
        &state,
        &actor,
        "update",
        "member",
        id,
        Some(member_json(&state, &before)),
        Some(member_json(&state, &after)),
    )
    .await;
    Ok(Json(member_json(&state, &after)).into_response())
}

async fn owners_in(state: &AppState, ws: i64) -> AdminResult<usize> {
    let rows: Vec<MemberRow> = state
        .store
        .rows_in(Table::Members, ws)
        .await
        .map_err(store_error)?;
    Ok(rows
        .iter()
        .filter(|m| m.active == 1 && m.role() == Role::Owner)
        .count())
}

/// The hash of a generated one-time password (argon2, on the blocking pool).
async fn one_time_password_hash(password: &str) -> AdminResult<String> {
    let password = password.to_owned();
    crypto::on_blocking_pool(move || crypto::hash_password(&password))
        .await
        .ok_or(ApiError::Internal)
}

/// `POST /admin/v1/members/{id}/reset-password`: a new one-time password, shown once; the
/// member's tokens are revoked.
pub async fn reset_password(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let m = member_in(&state, &actor, id).await?;
    may_assign(&actor, Some(m.role()), m.role())?;
    let password = crypto::generate_password();
    let hash = one_time_password_hash(&password).await?;
    let store = &state.store;
    store.set_member_password(id, &hash).await.map_err(store_error)?;
    store.bump_session_epoch(id).await.map_err(store_error)?;
    audit(&state, &actor, "reset_password", "member", id, None, None).await;
    Ok(Json(json!({"id": id, "one_time_password": password})).into_response())
}
