//! Gateway API keys: a member manages their own; owners and admins every key of the workspace.
//! The plaintext is shown once, at creation or rotation; the store keeps its SHA-256 and a display
//! prefix. A key may expire (`expires_at`); rotating it issues a new secret on the same key (same
//! quotas, usage, breaker and logs) while the replaced one works on for a grace time.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::key_limits;
use super::session::Actor;
use super::{
    AdminResult, Body, Id, Page, Params, audit, checked, config_changed, created, delete_policies,
    double_option, no_content, page_of, rfc3339, store_error,
};
use crate::breaker;
use crate::error::ApiError;
use crate::kernel::crypto;
use crate::kernel::managed::Kind;
use crate::state::AppState;
use crate::store::{AdminStore, ApiKeyRow, KeyGuardrails, KeyStore, MemberRow, Table};
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
    let now = state.clock.now_ms();
    let (trips, blocked_until, banned) = state.breakers.standing(k.id, now);
    // The replaced secret is shown while it still works only.
    let grace_end = k
        .previous_expires_at
        .filter(|t| *t > now && k.previous_key_hash.is_some());
    json!({
        "id": k.id,
        "name": k.name,
        "prefix": k.prefix,
        "member_id": k.member_id,
        "member_email": members.iter().find(|m| m.id == k.member_id).map(|m| m.email.clone()),
        "created_by": k.created_by,
        "created_at": k.created_at,
        "last_used_at": k.last_used_at,
        "allowed_models": stored_models(k.allowed_models.as_deref()),
        "max_in_flight": k.max_in_flight,
        "allowed_tags": stored_models(k.allowed_tags.as_deref()),
        "expires_at": k.expires_at.and_then(rfc3339),
        "expired": k.expires_at.is_some_and(|t| now >= t),
        "previous_secret_expires_at": grace_end.and_then(rfc3339),
        "breaker": {"trips": trips, "banned": banned, "blocked_until": blocked_until.and_then(rfc3339)},
        "managed_by": state.managed.by(Kind::ApiKey, k.id),
    })
}

/// A stored model allow-list as the API shows it: the list, or null for every model.
pub(super) fn stored_models(stored: Option<&str>) -> Value {
    match crate::kernel::caller::decode_model_list(stored) {
        Ok(list) => json!(list),
        Err(e) => {
            tracing::error!(error = %e, "unreadable model allow-list");
            Value::Null
        }
    }
}

/// The guardrails beside quotas of a key or member, as stored, after a request that may change
/// either (`None`: keep `before`'s; `Some(None)`: remove it).
pub(super) fn guardrails(
    allowed_models: Option<Option<Vec<String>>>,
    max_in_flight: Option<Option<i64>>,
    before: (Option<String>, Option<i64>),
) -> AdminResult<(Option<String>, Option<i64>)> {
    let allowed = match allowed_models {
        None => before.0,
        Some(None) => None,
        Some(Some(list)) => {
            let list = checked(
                "allowed_models",
                crate::auth::keys::allowed_models("allowed_models", &list),
            )?;
            crate::kernel::caller::encode_model_list(Some(&list))
        }
    };
    let cap = match max_in_flight {
        None => before.1,
        Some(cap) => checked(
            "max_in_flight",
            crate::auth::keys::max_in_flight("max_in_flight", cap),
        )?,
    };
    Ok((allowed, cap))
}

/// A key's tag allow-list as stored, after a request that may change it (`None`: keep
/// `before`; `Some(None)`: every tag).
fn tag_list(wanted: Option<Option<Vec<String>>>, before: Option<String>) -> AdminResult<Option<String>> {
    Ok(match wanted {
        None => before,
        Some(None) => None,
        Some(Some(list)) => {
            let list = checked(
                "allowed_tags",
                crate::kernel::tags::allowed_tags("allowed_tags", &list),
            )?;
            crate::kernel::caller::encode_model_list(Some(&list))
        }
    })
}

async fn members(state: &AppState, actor: &Actor) -> AdminResult<Vec<MemberRow>> {
    state
        .store
        .rows_in(Table::Members, actor.workspace_id())
        .await
        .map_err(store_error)
}

/// `GET /admin/v1/keys`: the actor's keys, or every key of the workspace for a manager, a page
/// at a time.
pub async fn list(State(state): State<AppState>, actor: Actor, Params(page): Params<Page>) -> AdminResult {
    let (after, limit) = page.bounds()?;
    let ws = actor.workspace_id();
    let keys: Vec<ApiKeyRow> = if actor.manages() {
        state
            .store
            .page_in(Table::ApiKeys, ws, after, limit + 1)
            .await
            .map_err(store_error)?
    } else {
        let mut own = state
            .store
            .keys_of_member(actor.member.id)
            .await
            .map_err(store_error)?;
        own.retain(|k| k.id > after);
        own.sort_unstable_by_key(|k| k.id);
        own
    };
    let (keys, next_cursor) = page_of(keys, limit, |k| k.id);
    let mut member_ids: Vec<i64> = keys.iter().map(|k| k.member_id).collect();
    member_ids.sort_unstable();
    member_ids.dedup();
    let members: Vec<MemberRow> = state
        .store
        .rows_with_ids(Table::Members, ws, &member_ids)
        .await
        .map_err(store_error)?;
    let data: Vec<Value> = keys.iter().map(|k| key_json(&state, k, &members)).collect();
    Ok(Json(json!({ "data": data, "next_cursor": next_cursor })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    name: String,
    /// Whose key: the actor's own if absent; a manager may name another member.
    #[serde(default)]
    member_id: Option<i64>,
    /// The public models the key may call: names or trailing-`*` patterns; null: every model.
    #[serde(default)]
    allowed_models: Option<Vec<String>>,
    /// The most requests the key may have in flight on one gateway; null: no cap.
    #[serde(default)]
    max_in_flight: Option<i64>,
    /// When the key stops working (RFC 3339, in the future); null: never.
    #[serde(default)]
    expires_at: Option<String>,
    /// The tags the key may send (`key=value` or `key=*`); null: every tag.
    #[serde(default)]
    allowed_tags: Option<Vec<String>>,
}

/// A key's `expires_at` as stored, from the request's RFC 3339 text (none: never).
fn expiry(text: Option<&str>) -> AdminResult<Option<i64>> {
    text.map(|t| checked("expires_at", validate::expires_at("expires_at", t)))
        .transpose()
}

/// `POST /admin/v1/keys` `{name, member_id?, allowed_models?, max_in_flight?, expires_at?, allowed_tags?}` → the
/// key, with its plaintext this once.
pub async fn create(State(state): State<AppState>, actor: Actor, Body(req): Body<NewKey>) -> AdminResult {
    let name = checked("name", validate::key_name("name", &req.name))?;
    let (allowed_models, max_in_flight) =
        guardrails(Some(req.allowed_models), Some(req.max_in_flight), (None, None))?;
    let expires_at = expiry(req.expires_at.as_deref())?;
    if expires_at.is_some_and(|t| t <= state.clock.now_ms()) {
        return Err(ApiError::field(
            "expires_at",
            "expires_at is in the past: a new key must expire later",
        ));
    }
    let mut wanted = KeyGuardrails {
        allowed_models,
        max_in_flight,
        expires_at,
        allowed_tags: tag_list(Some(req.allowed_tags), None)?,
    };
    let owner_id = req.member_id.unwrap_or(actor.member.id);
    if owner_id != actor.member.id && !actor.manages() {
        return Err(ApiError::Forbidden {
            message: "a member creates keys for themself only".into(),
        });
    }
    // DESIGN.md §11: a member's own key carries what an owner or admin set on their keys.
    let by_holder = owner_id == actor.member.id;
    if by_holder && key_limits::kept_for(&actor.member) {
        wanted = key_limits::carried(&actor.member, wanted)?;
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
    // The budgets set over the member's other keys move to the member (key_limits).
    let others: Vec<i64> = if by_holder {
        let keys = state.store.keys_of_member(owner.id).await.map_err(store_error)?;
        keys.iter().map(|k| k.id).collect()
    } else {
        Vec::new()
    };
    let plaintext = crypto::generate_api_key();
    let (key_hash, prefix) = (
        crypto::hash_api_key(&plaintext),
        crypto::display_prefix(&plaintext),
    );
    let new = crate::store::NewKey {
        workspace_id: actor.workspace_id(),
        member_id: owner.id,
        created_by: Some(actor.member.id),
        name: &name,
        key_hash: &key_hash,
        prefix: &prefix,
    };
    let mut k = state
        .store
        .create_key(&new, state.clock.now_ms())
        .await
        .map_err(store_error)?;
    if !wanted.is_empty() {
        // Before the plaintext is shown: no request can use the key without its guardrails.
        state
            .store
            .set_key_guardrails(k.id, &wanted)
            .await
            .map_err(store_error)?;
        (k.allowed_models, k.max_in_flight, k.expires_at, k.allowed_tags) = (
            wanted.allowed_models,
            wanted.max_in_flight,
            wanted.expires_at,
            wanted.allowed_tags,
        );
    }
    if !by_holder {
        // An owner's or admin's limits on a member's key are kept for the member's next keys.
        let set = |v: &Option<String>| v.clone().map(Some);
        key_limits::record(
            &state,
            owner,
            set(&k.allowed_models),
            k.max_in_flight.map(Some),
            set(&k.allowed_tags),
        )
        .await?;
    }
    if key_limits::move_budgets(&state, &actor, &others).await? {
        config_changed(&state).await?;
    }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyPatch {
    /// A list, or null for every model; absent keeps the current one.
    #[serde(default, with = "double_option")]
    allowed_models: Option<Option<Vec<String>>>,
    /// A cap, or null for none; absent keeps the current one.
    #[serde(default, with = "double_option")]
    max_in_flight: Option<Option<i64>>,
    /// An RFC 3339 time (a past one expires the key at once), or null for never; absent keeps
    /// the current one.
    #[serde(default, with = "double_option")]
    expires_at: Option<Option<String>>,
    /// A tag allow-list, or null for every tag; absent keeps the current one.
    #[serde(default, with = "double_option")]
    allowed_tags: Option<Option<Vec<String>>>,
}

/// `PATCH /admin/v1/keys/{id}` `{allowed_models?, max_in_flight?, expires_at?, allowed_tags?}` (owner or admin):
/// the key's guardrails beside quotas: from the key's next request here, within a second
/// elsewhere. A member sets them only when creating a key, so cannot lift what an owner or admin
/// set later.
pub async fn update(
    State(state): State<AppState>,
    actor: Actor,
    Id(id): Id,
    Body(req): Body<KeyPatch>,
) -> AdminResult {
    let k = visible_key(&state, &actor, id).await?;
    let asked = (
        req.allowed_models.is_some(),
        req.max_in_flight.is_some(),
        req.allowed_tags.is_some(),
    );
    let (allowed_models, max_in_flight) = guardrails(
        req.allowed_models,
        req.max_in_flight,
        (k.allowed_models.clone(), k.max_in_flight),
    )?;
    let expires_at = match &req.expires_at {
        None => k.expires_at,
        Some(text) => expiry(text.as_deref())?,
    };
    let wanted = KeyGuardrails {
        allowed_models,
        max_in_flight,
        expires_at,
        allowed_tags: tag_list(req.allowed_tags, k.allowed_tags.clone())?,
    };
    state
        .store
        .set_key_guardrails(k.id, &wanted)
        .await
        .map_err(store_error)?;
    let members = members(&state, &actor).await?;
    // DESIGN.md §11: what an owner or admin sets on a member's key, the member's next keys carry.
    if let Some(holder) = members.iter().find(|m| m.id == k.member_id) {
        let (models, cap, tags) = asked;
        key_limits::record(
            &state,
            holder,
            models.then(|| wanted.allowed_models.clone()),
            cap.then_some(wanted.max_in_flight),
            tags.then(|| wanted.allowed_tags.clone()),
        )
        .await?;
    }
    config_changed(&state).await?;
    let before = key_json(&state, &k, &members);
    let after = ApiKeyRow {
        allowed_models: wanted.allowed_models,
        max_in_flight: wanted.max_in_flight,
        expires_at: wanted.expires_at,
        allowed_tags: wanted.allowed_tags,
        ..k
    };
    let body = key_json(&state, &after, &members);
    audit(
        &state,
        &actor,
        "update",
        "api_key",
        id,
        Some(before),
        Some(body.clone()),
    )
    .await;
    Ok(Json(body).into_response())
}

/// `DELETE /admin/v1/keys/{id}`: the key stops working on every gateway within a second; the
/// budgets set on it go with it, but those set over a member deleting their own key move to the
/// member (key_limits).
pub async fn delete(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let k = visible_key(&state, &actor, id).await?;
    let members = members(&state, &actor).await?;
    let before = key_json(&state, &k, &members);
    // A member's own key: the budgets an owner or admin set on it move to the member first.
    if k.member_id == actor.member.id {
        key_limits::move_budgets(&state, &actor, &[k.id]).await?;
    }
    delete_policies(&state, actor.workspace_id(), |p| {
        p.subject == "apikey" && p.target_id == k.id
    })
    .await?;
    state.store.delete_key(k.id).await.map_err(store_error)?;
    config_changed(&state).await?;
    audit(&state, &actor, "delete", "api_key", k.id, Some(before), None).await;
    Ok(no_content())
}

/// The grace of a replaced secret when the request names none: a day, time for a deployment.
pub const DEFAULT_GRACE_SECS: i64 = 86_400;
/// The longest grace: 30 days.
pub const MAX_GRACE_SECS: i64 = 30 * 86_400;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rotation {
    /// How long the replaced secret keeps working: 0 (stops at once) to 30 days; a day if absent.
    #[serde(default)]
    grace_seconds: Option<i64>,
}

/// `POST /admin/v1/keys/{id}/rotate` `{grace_seconds?}` (whoever may delete the key): a new
/// secret on the same key, its plaintext in the answer this once. The replaced secret keeps
/// working for the grace, then answers like an unknown key; a secret still in grace from an
/// earlier rotation stops at once. Quotas, usage, breaker, logs and expiry stay the key's.
pub async fn rotate(
    State(state): State<AppState>,
    actor: Actor,
    Id(id): Id,
    Body(req): Body<Rotation>,
) -> AdminResult {
    let k = visible_key(&state, &actor, id).await?;
    let grace = req.grace_seconds.unwrap_or(DEFAULT_GRACE_SECS);
    if !(0..=MAX_GRACE_SECS).contains(&grace) {
        return Err(ApiError::field(
            "grace_seconds",
            format!("grace_seconds must be between 0 and {MAX_GRACE_SECS} (30 days)"),
        ));
    }
    let grace_end = (grace > 0).then(|| state.clock.now_ms().saturating_add(grace * 1000));
    let plaintext = crypto::generate_api_key();
    let rotated = state
        .store
        .rotate_key(
            k.id,
            &crypto::hash_api_key(&plaintext),
            &crypto::display_prefix(&plaintext),
            grace_end,
        )
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "API key" })?;
    config_changed(&state).await?;
    let members = members(&state, &actor).await?;
    let before = key_json(&state, &k, &members);
    let mut body = key_json(&state, &rotated, &members);
    audit(
        &state,
        &actor,
        "rotate",
        "api_key",
        k.id,
        Some(before),
        Some(body.clone()),
    )
    .await;
    body["key"] = json!(plaintext);
    Ok(Json(body).into_response())
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
