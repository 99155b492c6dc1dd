//! Gateway API keys: a member manages their own; owners and admins every key of the workspace.
//! The plaintext is shown once, at creation; the store keeps its SHA-256 and a display prefix.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{
    AdminResult, Body, Id, audit, checked, config_changed, created, delete_policies, no_content, rfc3339,
    store_error,
};
use crate::app::AppState;
use crate::breaker;
use crate::crypto;
use crate::error::ApiError;
use crate::managed::Kind;
use crate::store::{AdminStore, ApiKeyRow, KeyStore, MemberRow, Table};
use crate::validate;

/// The key `id` if the actor may see it: their own, or any of the workspace for a manager.
pub async fn visible_key(state: &AppState, actor: &Actor, id: i64) -> AdminResult<ApiKeyRow> {
    let key: Option<ApiKeyRow> = state
        .store
        .row_in(Table::ApiKeys, actor.workspace_id(), id)
        .await
        .map_err(store_error)?;
    key.filter(|k| k.member_id == actor.member.id || actor.manages())
        .ok_or(ApiError::NotFound { what: "API key" })
}

fn key_json(state: &AppState, k: &ApiKeyRow, members: &[MemberRow]) -> Value {
    let (trips, blocked_until, banned) = state.breakers.standing(k.id, state.clock.now_ms());
    json!({
        "id": k.id,
        "name": k.name,
        "prefix": k.prefix,
        "member_id": k.member_id,
        "member_email": members.iter().find(|m| m.id == k.member_id).map(|m| m.email.clone()),
        "created_by": k.created_by,
        "created_at": k.created_at,
        "last_used_at": k.last_used_at,
        "breaker": {"trips": trips, "banned": banned, "blocked_until": blocked_until.and_then(rfc3339)},
        "managed_by": state.managed.by(Kind::ApiKey, k.id),
    })
}

async fn members(state: &AppState, actor: &Actor) -> AdminResult<Vec<MemberRow>> {
    state
        .store
        .rows_in(Table::Members, actor.workspace_id())
        .await
        .map_err(store_error)
}

/// `GET /admin/v1/keys`: the actor's keys, or every key of the workspace for a manager.
pub async fn list(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let keys: Vec<ApiKeyRow> = if actor.manages() {
        state
            .store
            .rows_in(Table::ApiKeys, actor.workspace_id())
            .await
            .map_err(store_error)?
    } else {
        state
            .store
            .keys_of_member(actor.member.id)
            .await
            .map_err(store_error)?
    };
    let members = members(&state, &actor).await?;
    let data: Vec<Value> = keys.iter().map(|k| key_json(&state, k, &members)).collect();
    Ok(Json(json!({ "data": data })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    name: String,
    /// Whose key: the actor's own if absent; a manager may name another member.
    #[serde(default)]
    member_id: Option<i64>,
}

/// `POST /admin/v1/keys` `{name, member_id?}` → the key, with its plaintext this once.
pub async fn create(State(state): State<AppState>, actor: Actor, Body(req): Body<NewKey>) -> AdminResult {
    let name = checked("name", validate::key_name("name", &req.name))?;
    let owner_id = req.member_id.unwrap_or(actor.member.id);
    if owner_id != actor.member.id && !actor.manages() {
        return Err(ApiError::Forbidden {
            message: "a member creates keys for themself only".into(),
        });
    }
    let members = members(&state, &actor).await?;
    let Some(owner) = members.iter().find(|m| m.id == owner_id) else {
        return Err(ApiError::field(
            "member_id",
            format!("member {owner_id} does not exist in this workspace"),
        ));
    };
    if state
        .store
        .key_by_name(owner.id, &name)
        .await
        .map_err(store_error)?
        .is_some()
    {
        return Err(ApiError::Conflict {
            message: format!("{} already has a key named {name:?}", owner.email),
        });
    }
    let plaintext = crypto::generate_api_key();
    let k = state
        .store
        .create_key(
            actor.workspace_id(),
            owner.id,
            Some(actor.member.id),
            &name,
            &crypto::hash_api_key(&plaintext),
            &crypto::display_prefix(&plaintext),
            state.clock.now_ms(),
        )
        .await
        .map_err(store_error)?;
    let mut body = key_json(&state, &k, &members);
    audit(
        &state,
        &actor,
        "create",
        "api_key",
        k.id,
        None,
        Some(body.clone()),
    )
    .await;
    body["key"] = json!(plaintext);
    Ok(created(body))
}

/// `GET /admin/v1/keys/{id}`.
pub async fn get(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let k = visible_key(&state, &actor, id).await?;
    let members = members(&state, &actor).await?;
    Ok(Json(key_json(&state, &k, &members)).into_response())
}

/// `DELETE /admin/v1/keys/{id}`: the key stops working on every gateway within a second; the
/// budgets set on it go with it.
pub async fn delete(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let k = visible_key(&state, &actor, id).await?;
    let members = members(&state, &actor).await?;
    let before = key_json(&state, &k, &members);
    delete_policies(&state, actor.workspace_id(), |p| {
        p.subject == "apikey" && p.target_id == k.id
    })
    .await?;
    state.store.delete_key(k.id).await.map_err(store_error)?;
    config_changed(&state).await?;
    audit(&state, &actor, "delete", "api_key", k.id, Some(before), None).await;
    Ok(no_content())
}

/// `GET /admin/v1/keys/{id}/breaker`: trips so far, blocked until, banned, and the history of its
/// trips. A ban cannot be lifted here or anywhere: delete the key and create a new one.
pub async fn breaker(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let key = visible_key(&state, &actor, id).await?;
    let history = breaker::history(&state.store, key.id)
        .await
        .map_err(store_error)?;
    let (trips, blocked_until, banned) = state.breakers.standing(key.id, state.clock.now_ms());
    Ok(Json(json!({
        "key_id": key.id,
        "trips": trips,
        "banned": banned,
        "blocked_until": blocked_until.and_then(rfc3339),
        "history": history.iter().map(|t| json!({
            "trip": t.trip,
            "at": rfc3339(t.at),
            "requests": t.requests,
            "failures": t.failures,
            "blocked_until": t.blocked_until.and_then(rfc3339),
            "banned": t.banned,
        })).collect::<Vec<_>>(),
    }))
    .into_response())
}
