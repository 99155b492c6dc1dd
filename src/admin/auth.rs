//! Sign-in, sign-out, password change, and what a signed-in member reads about themself.

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::json;

use super::session::Actor;
use super::{AdminResult, Body, no_content, store_error};
use crate::auth::session;
use crate::error::ApiError;
use crate::kernel::caller::Caller;
use crate::kernel::crypto;
use crate::quota::engine::QuotaDecision;
use crate::state::AppState;
use crate::store::{AdminStore, KeyStore, MemberStore, WorkspaceStore};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    email: String,
    password: String,
}

/// `POST /admin/v1/auth/login` `{email, password}` → `{token, expires_at, role}`. Failed sign-ins
/// are slowed per address and per email.
pub async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Body(req): Body<LoginRequest>,
) -> AdminResult {
    let client = state.client_ip(peer, &headers);
    if let Err(retry_after) = state.sessions.may_try(client, &req.email) {
        return Err(ApiError::AuthThrottled { retry_after });
    }
    let member = state
        .store
        .member_by_email(&req.email)
        .await
        .map_err(store_error)?;
    // Verify against a dummy hash when the member is unknown, so timing tells nothing.
    let hash = member.as_ref().and_then(|m| m.password_hash.clone());
    let has_hash = hash.is_some();
    let password = req.password;
    let ok = crypto::on_blocking_pool(move || {
        crypto::verify_password(&password, hash.as_deref().unwrap_or(session::DUMMY_HASH.as_str()))
    })
    .await
    .unwrap_or(false);
    match member {
        Some(m) if ok && has_hash && m.active == 1 && super::sso::sso_only(&state, m.workspace_id).await => {
            Err(ApiError::Forbidden {
                message: "this workspace signs in through single sign-on only: use \"Sign in with SSO\""
                    .into(),
            })
        }
        Some(m) if ok && has_hash && m.active == 1 => {
            let (token, expires_at) = state.sessions.issue(&m, state.clock.now());
            Ok(
                Json(json!({"token": token, "expires_at": expires_at.to_rfc3339(), "role": m.role}))
                    .into_response(),
            )
        }
        _ => {
            state.sessions.failed(client, &req.email);
            Err(ApiError::InvalidCredentials)
        }
    }
}

/// Sign-out and password change are a person's: a service token is stopped by revoking it.
fn in_person(actor: &Actor, what: &str) -> AdminResult<()> {
    match &actor.token {
        Some(t) => Err(ApiError::Forbidden {
            message: format!(
                "a service token cannot {what}; revoke it instead (DELETE /admin/v1/tokens/{})",
                t.id
            ),
        }),
        None => Ok(()),
    }
}

/// `POST /admin/v1/auth/logout`: revokes every token of the signed-in member.
pub async fn logout(State(state): State<AppState>, actor: Actor) -> AdminResult {
    in_person(&actor, "sign out")?;
    state
        .store
        .bump_session_epoch(actor.member.id)
        .await
        .map_err(store_error)?;
    Ok(no_content())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasswordChange {
    current_password: String,
    new_password: String,
}

/// `POST /admin/v1/auth/password` `{current_password, new_password}` → a fresh token; every
/// earlier token of the member is revoked.
pub async fn change_password(
    State(state): State<AppState>,
    actor: Actor,
    Body(req): Body<PasswordChange>,
) -> AdminResult {
    in_person(&actor, "change a password")?;
    let email = &actor.member.email;
    let client = actor.client_ip;
    if let Err(retry_after) = state.sessions.may_try(client, email) {
        return Err(ApiError::AuthThrottled { retry_after });
    }
    let current = actor.member.password_hash.clone();
    let PasswordChange {
        current_password,
        new_password,
    } = req;
    let verified = crypto::on_blocking_pool(move || {
        crypto::verify_password(
            &current_password,
            current.as_deref().unwrap_or(session::DUMMY_HASH.as_str()),
        )
    });
    if !verified.await.unwrap_or(false) {
        state.sessions.failed(client, email);
        return Err(ApiError::field(
            "current_password",
            "current_password is not your password",
        ));
    }
    check_password("new_password", &new_password)?;
    let hash = crypto::on_blocking_pool(move || crypto::hash_password(&new_password))
        .await
        .ok_or(ApiError::Internal)?;
    let store = &state.store;
    store
        .set_member_password(actor.member.id, &hash)
        .await
        .map_err(store_error)?;
    store
        .bump_session_epoch(actor.member.id)
        .await
        .map_err(store_error)?;
    let member = store
        .member(actor.member.id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::InvalidToken)?;
    let (token, expires_at) = state.sessions.issue(&member, state.clock.now());
    Ok(Json(json!({"token": token, "expires_at": expires_at.to_rfc3339()})).into_response())
}

/// A password a member may choose: 8 to 200 characters.
pub fn check_password(field: &str, password: &str) -> AdminResult<()> {
    super::checked(field, crate::validate::password(field, password))
}

/// `GET /admin/v1/me`: who is signed in: the member, the role the request acts with, and the
/// service token it came with, if any.
pub async fn me(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let m = &actor.member;
    let workspace = state.store.workspace(m.workspace_id).await.map_err(store_error)?;
    Ok(Json(json!({
        "id": m.id,
        "email": m.email,
        "role": actor.role().as_str(),
        "service_token": actor.token.as_ref().map(|t| json!({"id": t.id, "name": t.name, "prefix": t.prefix})),
        "workspace": workspace.map(|w| json!({"id": w.id, "name": w.name, "timezone": state.timezone_of(w.id).name()})),
        "department_id": m.department_id,
    }))
    .into_response())
}

/// `GET /admin/v1/me/quota`: every quota that applies to the signed-in member — their member,
/// department and workspace policies, and the budgets on each of their keys.
pub async fn my_quota(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let member = &actor.member;
    let keys = state.store.keys_of_member(member.id).await.map_err(store_error)?;
    let tz = state.timezone_of(member.workspace_id);
    let policies = state.policies.load();
    let now = state.clock.now();
    let caller = |key_id: i64| Caller {
        key_id,
        member_id: member.id,
        department_id: member.department_id,
        workspace_id: member.workspace_id,
        models: Default::default(),
        in_flight: Default::default(),
        allowed_tags: None,
    };
    // Member, department and workspace quotas (no key: key id 0 matches no key policy).
    let d = state
        .quota
        .check(&state.store, &policies, &caller(0), now, tz)
        .await
        .map_err(store_error)?;
    let mut rows = rows_of(&d, None, tz);
    for k in &keys {
        let mut d = state
            .quota
            .check(&state.store, &policies, &caller(k.id), now, tz)
            .await
            .map_err(store_error)?;
        d.standings
            .retain(|s| s.rule.subject == crate::quota::SubjectKind::Apikey);
        rows.extend(rows_of(&d, Some((k.id, &k.name)), tz));
    }
    Ok(Json(json!({"timezone": tz.name(), "quotas": rows})).into_response())
}

/// The decision's rows as `/v1/quota` has them, with the key they belong to and the end of
/// each window (the console shows that; `reset_at` is for clients).
fn rows_of(d: &QuotaDecision, key: Option<(i64, &str)>, tz: chrono_tz::Tz) -> Vec<serde_json::Value> {
    crate::quota::report::rows(d, &Default::default(), crate::quota::Metric::as_str)
        .into_iter()
        .zip(&d.standings)
        .map(|(mut row, s)| {
            row["window_end"] = json!(super::window_end(s, tz));
            if let Some((id, name)) = key {
                row["key_id"] = json!(id);
                row["key_name"] = json!(name);
            }
            row
        })
        .collect()
}
