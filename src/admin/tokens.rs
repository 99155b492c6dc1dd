//! Admin service tokens (DESIGN.md §11): for automation (CI, Terraform, scripts). An owner or
//! admin creates one scoped to the workspace and a role no higher than the one they act with;
//! its secret is shown once and stored as a SHA-256 hash; it is sent as `Authorization: Bearer`,
//! acts for its creator with the lower of its role and theirs, may expire, notes its last use,
//! and stops on every gateway at its next request once revoked. Creation and revocation are
//! audited; requests made with a token name it in the audit log.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{AdminResult, Body, Id, audit, checked, created, no_content, rfc3339, store_error};
use crate::error::ApiError;
use crate::kernel::crypto;
use crate::state::AppState;
use crate::store::{AdminStore, MemberRow, NewServiceToken, Role, ServiceTokenRow, Table, TokenStore};
use crate::validate;

/// A token as the API shows it (never its secret).
fn token_json(t: &ServiceTokenRow, now: i64, members: &[MemberRow]) -> Value {
    let email = |id: Option<i64>| {
        id.and_then(|id| members.iter().find(|m| m.id == id))
            .map(|m| m.email.clone())
    };
    let status = match (t.revoked_at, t.expires_at) {
        (Some(_), _) => "revoked",
        (None, Some(e)) if now >= e => "expired",
        _ => "active",
    };
    json!({
        "id": t.id,
        "name": t.name,
        "role": t.role,
        "prefix": t.prefix,
        "status": status,
        "created_by": t.created_by,
        "created_by_email": email(Some(t.created_by)),
        "created_at": t.created_at,
        "expires_at": t.expires_at.and_then(rfc3339),
        "last_used_at": t.last_used_at,
        "revoked_at": t.revoked_at,
        "revoked_by_email": email(t.revoked_by),
    })
}

async fn members(state: &AppState, actor: &Actor) -> AdminResult<Vec<MemberRow>> {
    state
        .store
        .rows_in(Table::Members, actor.workspace_id())
        .await
        .map_err(store_error)
}

/// `GET /admin/v1/tokens` (owner or admin): every service token of the workspace, revoked and
/// expired ones included, oldest first.
pub async fn list(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let tokens = state
        .store
        .service_tokens_in(actor.workspace_id())
        .await
        .map_err(store_error)?;
    let members = members(&state, &actor).await?;
    let now = state.clock.now_ms();
    let data: Vec<Value> = tokens.iter().map(|t| token_json(t, now, &members)).collect();
    Ok(Json(json!({ "data": data })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// What it is for.
    name: String,
    /// `owner`, `admin` or `member`: at most the role the creator acts with.
    role: String,
    /// When it stops working (RFC 3339, in the future); absent or null: never.
    #[serde(default)]
    expires_at: Option<String>,
}

/// `POST /admin/v1/tokens` `{name, role, expires_at?}` (owner or admin) → the token, with its
/// secret this once. Nobody mints a token above the role they act with: an admin no owner
/// token, an admin token no owner token either.
pub async fn create(State(state): State<AppState>, actor: Actor, Body(req): Body<NewToken>) -> AdminResult {
    let name = checked("name", validate::name("name", &req.name))?;
    let role: Role = req.role.parse().map_err(|m: String| ApiError::field("role", m))?;
    if !actor.role().covers(role) {
        return Err(ApiError::Forbidden {
            message: format!(
                "a service token's role cannot be above the role it is created with: you act as {}, \
                 so its role may be {}",
                actor.role().as_str(),
                match actor.role() {
                    Role::Admin => "admin or member",
                    _ => "member",
                }
            ),
        });
    }
    let now = state.clock.now_ms();
    let expires_at = req
        .expires_at
        .as_deref()
        .map(|t| checked("expires_at", validate::expires_at("expires_at", t)))
        .transpose()?;
    if expires_at.is_some_and(|t| t <= now) {
        return Err(ApiError::field(
            "expires_at",
            "expires_at is in the past: a new token must expire later",
        ));
    }
    let secret = crypto::generate_service_token();
    let (token_hash, prefix) = (
        crypto::hash_api_key(&secret),
        crypto::service_token_prefix(&secret),
    );
    let row = state
        .store
        .create_service_token(
            &NewServiceToken {
                workspace_id: actor.workspace_id(),
                name: &name,
                role: role.as_str(),
                token_hash: &token_hash,
                prefix: &prefix,
                created_by: actor.member.id,
                expires_at,
            },
            now,
        )
        .await
        .map_err(store_error)?;
    let members = members(&state, &actor).await?;
    let mut body = token_json(&row, now, &members);
    audit(
        &state,
        &actor,
        "create",
        "service_token",
        row.id,
        None,
        Some(body.clone()),
    )
    .await;
    body["token"] = json!(secret);
    Ok(created(body))
}

/// `DELETE /admin/v1/tokens/{id}` (owner or admin): revokes the token; every gateway refuses it
/// from its next request. Only a role that covers the token's may revoke it (an admin cannot
/// stop the owner's automation). Revoking a revoked token changes nothing.
pub async fn revoke(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let t = state
        .store
        .service_token_in(actor.workspace_id(), id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound {
            what: "service token",
        })?;
    if !actor.role().covers(t.role()) {
        return Err(ApiError::Forbidden {
            message: format!(
                "only the owner can revoke a token with the {} role; you act as {}",
                t.role,
                actor.role().as_str()
            ),
        });
    }
    let now = state.clock.now_ms();
    if state
        .store
        .revoke_service_token(t.id, now, actor.member.id)
        .await
        .map_err(store_error)?
    {
        let members = members(&state, &actor).await?;
        let before = token_json(&t, now, &members);
        let after = token_json(
            &ServiceTokenRow {
                revoked_at: Some(now),
                revoked_by: Some(actor.member.id),
                ..t.clone()
            },
            now,
            &members,
        );
        audit(
            &state,
            &actor,
            "revoke",
            "service_token",
            t.id,
            Some(before),
            Some(after),
        )
        .await;
    }
    Ok(no_content())
}
