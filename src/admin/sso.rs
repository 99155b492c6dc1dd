//! Single sign-on for the console (OpenID Connect, [`crate::auth::oidc`]): the redirect to the identity
//! provider, its return, and what the groups it names give — a workspace, a role, a department.
//! The first sign-in creates the member (just in time); later ones bring their role in step with
//! the groups; a member in no mapped group is refused and their open sessions are revoked. Each
//! outcome is in the audit log.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::session::Actor;
use super::{AdminResult, audit, store_error};
use crate::auth::oidc::{Identity, OidcError, PENDING_TTL_SECS, Pending, constant_time_eq};
use crate::config::sso::SsoGroup;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{AdminStore, DepartmentStore, MemberRow, MemberStore, NewMember, Role, WorkspaceStore};

/// The cookie that carries a sign-in under way (sealed with the master key).
const COOKIE: &str = "aigw_oidc";
/// Where the cookie is sent: only back to these endpoints.
const COOKIE_PATH: &str = "/admin/v1/auth/oidc";

/// `GET /admin/v1/auth/methods`: how the console may sign in.
pub async fn methods(State(state): State<AppState>) -> AdminResult {
    let sso = state
        .oidc
        .as_ref()
        .map(|_| json!({"start_url": "/admin/v1/auth/oidc/start"}));
    Ok(axum::Json(json!({"password": true, "sso": sso})).into_response())
}

/// `GET /admin/v1/auth/oidc/start`: sends the browser to the identity provider, with a fresh
/// state, nonce and PKCE verifier kept in a sealed, HTTP-only cookie.
pub async fn start(State(state): State<AppState>) -> AdminResult {
    let Some(oidc) = &state.oidc else {
        return Err(not_configured());
    };
    let (url, pending) = match oidc.begin(state.clock.now_ms()).await {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(error = %e, "single sign-on could not start");
            return Ok(back_to_console(&state, Err("provider_error"), None));
        }
    };
    let sealed = state
        .master_key
        .seal(&serde_json::to_string(&pending).unwrap_or_default());
    let secure = if oidc.secure() { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={sealed}; Max-Age={PENDING_TTL_SECS}; Path={COOKIE_PATH}; HttpOnly; SameSite=Lax{secure}"
    );
    let mut resp = (StatusCode::FOUND, [(header::LOCATION, url)]).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

#[derive(Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// `GET /admin/v1/auth/oidc/callback`: the provider's return. On success the browser goes to the
/// console with an admin token in the URL's fragment (never sent to a server); on failure with
/// the reason, and the details go to the gateway's log.
pub async fn callback(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> AdminResult {
    let Some(oidc) = &state.oidc else {
        return Err(not_configured());
    };
    let client_ip = state.client_ip(peer, &headers);
    let pending = pending_of(&state, &headers);
    let now_ms = state.clock.now_ms();
    let outcome = async {
        if let Some(e) = &q.error {
            tracing::info!(error = %e, "the identity provider returned no sign-in");
            return Err("provider_refused");
        }
        let Some(pending) = pending.filter(|p| p.exp > now_ms / 1000) else {
            return Err("sign_in_expired");
        };
        let given = q.state.as_deref().unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), pending.state.as_bytes()) {
            return Err("state_mismatch");
        }
        let code = q
            .code
            .as_deref()
            .filter(|c| !c.is_empty())
            .ok_or("provider_refused")?;
        let identity = oidc.finish(&pending, code, now_ms).await.map_err(|e| {
            tracing::warn!(error = %e, "single sign-on refused");
            match e {
                OidcError::Provider(_) => "provider_error",
                OidcError::Refused(_) => "token_refused",
            }
        })?;
        sign_in(&state, &identity, client_ip).await
    }
    .await;
    Ok(back_to_console(&state, outcome, Some(oidc.secure())))
}

/// What the identity's groups give: the member signed in (created or brought in step), or why
/// not.
async fn sign_in(
    state: &AppState,
    id: &Identity,
    client_ip: std::net::IpAddr,
) -> Result<String, &'static str> {
    let store = &state.store;
    let existing = store
        .member_by_email(&id.email)
        .await
        .map_err(|_| "unavailable")?;
    let Some((mapping, workspace_id)) = mapping_for(state, &id.groups, existing.as_ref()).await else {
        if let Some(m) = &existing
            && manages(state, m.workspace_id).await
        {
            // Removed from every mapped group: this and every open session end now.
            let _ = store.bump_session_epoch(m.id).await;
            let actor = Actor::signed_in(m.clone(), client_ip);
            audit(
                state,
                &actor,
                "auth.sso_denied",
                "member",
                m.id,
                None,
                Some(json!({"groups": id.groups})),
            )
            .await;
        }
        tracing::info!(email = %id.email, groups = ?id.groups, "single sign-on: no mapped group");
        return Err("no_access");
    };
    let department_id = match &mapping.department {
        Some(name) => store
            .department_by_name(workspace_id, name)
            .await
            .map_err(|_| "unavailable")?
            .map(|d| d.id),
        None => None,
    };
    let member = match existing {
        Some(m) if m.active != 1 => return Err("member_disabled"),
        Some(m) if m.workspace_id != workspace_id => return Err("no_access"),
        Some(m) => {
            let department = department_id.or(m.department_id);
            // An owner stays one: the workspace never loses its owner to a group's lower role.
            let role = if m.role == Role::Owner.as_str() {
                m.role.clone()
            } else {
                mapping.role.clone()
            };
            if m.role != role || department != m.department_id {
                store
                    .update_member(m.id, department, &role)
                    .await
                    .map_err(|_| "unavailable")?;
                let actor = Actor::signed_in(m.clone(), client_ip);
                audit(
                    state,
                    &actor,
                    "member.sso_update",
                    "member",
                    m.id,
                    Some(json!({"role": m.role, "department_id": m.department_id})),
                    Some(json!({"role": role, "department_id": department})),
                )
                .await;
            }
            store.member(m.id).await.ok().flatten().ok_or("unavailable")?
        }
        None => {
            let new = NewMember {
                workspace_id,
                department_id,
                email: &id.email,
                role: &mapping.role,
                password_hash: None,
            };
            let m = store
                .create_member(&new, state.clock.now_ms())
                .await
                .map_err(|e| {
                    tracing::warn!(error = %store_error(e), "single sign-on could not create the member");
                    "unavailable"
                })?;
            let actor = Actor::signed_in(m.clone(), client_ip);
            let after = json!({"email": m.email, "role": m.role, "department_id": m.department_id});
            audit(
                state,
                &actor,
                "member.sso_create",
                "member",
                m.id,
                None,
                Some(after),
            )
            .await;
            m
        }
    };
    let (token, _) = state.sessions.issue(&member, state.clock.now());
    let actor = Actor::signed_in(member.clone(), client_ip);
    let after = json!({"subject": id.subject, "groups": id.groups});
    audit(
        state,
        &actor,
        "auth.sso_login",
        "member",
        member.id,
        None,
        Some(after),
    )
    .await;
    Ok(token)
}

/// The mapping that applies to these groups, and its workspace's id: the one giving the highest
/// role (the first listed of equals), within the member's own workspace when they have one.
async fn mapping_for(
    state: &AppState,
    groups: &[String],
    member: Option<&MemberRow>,
) -> Option<(SsoGroup, i64)> {
    let rank = |role: &str| match role.parse::<Role>() {
        Ok(Role::Owner) => 3,
        Ok(Role::Admin) => 2,
        _ => 1,
    };
    let mut best: Option<(SsoGroup, i64)> = None;
    for m in state
        .settings
        .oidc_groups
        .iter()
        .filter(|m| groups.contains(&m.group))
    {
        let Ok(Some(ws)) = state.store.workspace_by_name(&m.workspace).await else {
            tracing::warn!(workspace = %m.workspace, "oidc_groups names a workspace that does not exist");
            continue;
        };
        if member.is_some_and(|mb| mb.workspace_id != ws.id) {
            continue;
        }
        if best.as_ref().is_none_or(|(b, _)| rank(&m.role) > rank(&b.role)) {
            best = Some((m.clone(), ws.id));
        }
    }
    best
}

/// Whether some `oidc_groups` entry gives access to `workspace_id` (its members' access is then
/// the provider's to decide).
async fn manages(state: &AppState, workspace_id: i64) -> bool {
    match state.store.workspace(workspace_id).await {
        Ok(Some(ws)) => state.settings.oidc_groups.iter().any(|g| g.workspace == ws.name),
        _ => false,
    }
}

/// The sign-in under way that the browser's cookie carries, if it is ours and readable.
fn pending_of(state: &AppState, headers: &HeaderMap) -> Option<Pending> {
    let sealed = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .next()?;
    let json = state.master_key.open(sealed).ok()?;
    serde_json::from_str(&json).ok()
}

/// A redirect to the console: `#sso_token=…` on success, `#sso_error=…` otherwise; the cookie of
/// the sign-in is cleared.
fn back_to_console(
    state: &AppState,
    outcome: Result<String, &'static str>,
    secure: Option<bool>,
) -> Response {
    let base = state
        .oidc
        .as_ref()
        .map_or("/console/".to_owned(), |o| o.console_url());
    let location = match outcome {
        Ok(token) => format!("{base}#sso_token={token}"),
        Err(why) => format!("{base}#sso_error={why}"),
    };
    let mut resp = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if let Some(secure) = secure {
        let flag = if secure { "; Secure" } else { "" };
        let clear = format!("{COOKIE}=; Max-Age=0; Path={COOKIE_PATH}; HttpOnly; SameSite=Lax{flag}");
        if let Ok(v) = HeaderValue::from_str(&clear) {
            h.insert(header::SET_COOKIE, v);
        }
    }
    resp
}

fn not_configured() -> ApiError {
    ApiError::NotFound {
        what: "single sign-on (oidc_issuer is not set)",
    }
}

/// Whether `workspace_id` signs in only through single sign-on (`sso_only_workspaces`).
pub async fn sso_only(state: &AppState, workspace_id: i64) -> bool {
    if state.settings.sso_only_workspaces.is_empty() {
        return false;
    }
    match state.store.workspace(workspace_id).await {
        Ok(Some(ws)) => state.settings.sso_only_workspaces.contains(&ws.name),
        _ => false,
    }
}
