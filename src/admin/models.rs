//! Public models: price (credits per million tokens, stored as integer micro-credits) and the
//! fallback chain.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Actor;
use super::{
    AdminResult, Body, Id, audit, checked, config_changed, created, double_option, name_field, no_content,
    store_error,
};
use crate::error::ApiError;
use crate::kernel::credits::micros_to_credits;
use crate::kernel::managed::Kind;
use crate::state::AppState;
use crate::store::{AdminStore, ModelRow, ModelStore, Table, UpstreamRow};
use crate::upstream::fields;
use crate::validate;

fn model_json(state: &AppState, m: &ModelRow, upstreams: &[UpstreamRow]) -> Value {
    let served_by: Vec<&str> = upstreams
        .iter()
        .filter(|u| u.served_models().iter().any(|s| s.name == m.name))
        .map(|u| u.name.as_str())
        .collect();
    json!({
        "id": m.id,
        "name": m.name,
        "fallbacks": m.fallback_names(),
        "price": {
            "prompt": micros_to_credits(m.price_prompt),
            "completion": micros_to_credits(m.price_completion),
        },
        "max_output_tokens": m.max_output_tokens,
        "served_by": served_by,
        "created_at": m.created_at,
        "managed_by": state.managed.by(Kind::Model, m.id),
    })
}

async fn upstreams(state: &AppState, ws: i64) -> AdminResult<Vec<UpstreamRow>> {
    state
        .store
        .rows_in(Table::Upstreams, ws)
        .await
        .map_err(store_error)
}

async fn model_in(state: &AppState, actor: &Actor, id: i64) -> AdminResult<ModelRow> {
    state
        .store
        .row_in(Table::Models, actor.workspace_id(), id)
        .await
        .map_err(store_error)?
        .ok_or(ApiError::NotFound { what: "model" })
}

/// `GET /admin/v1/models`.
pub async fn list(State(state): State<AppState>, actor: Actor) -> AdminResult {
    let rows: Vec<ModelRow> = state
        .store
        .rows_in(Table::Models, actor.workspace_id())
        .await
        .map_err(store_error)?;
    let ups = upstreams(&state, actor.workspace_id()).await?;
    let data: Vec<Value> = rows.iter().map(|m| model_json(&state, m, &ups)).collect();
    Ok(Json(json!({ "data": data })).into_response())
}

/// `GET /admin/v1/models/{id}`.
pub async fn get(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let m = model_in(&state, &actor, id).await?;
    let ups = upstreams(&state, actor.workspace_id()).await?;
    Ok(Json(model_json(&state, &m, &ups)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceInput {
    #[serde(default)]
    prompt: f64,
    #[serde(default)]
    completion: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInput {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    fallbacks: Option<Vec<String>>,
    #[serde(default)]
    price: Option<PriceInput>,
    /// Absent: unchanged; `null`: the default; a number: the model's own output limit.
    #[serde(default, with = "double_option")]
    max_output_tokens: Option<Option<i64>>,
}

/// Checks `input` and applies it over `row`: a fallback must be another model of the workspace
/// (declared or served by one of its credentials).
async fn apply(state: &AppState, row: &mut ModelRow, input: ModelInput, creating: bool) -> AdminResult<()> {
    match &input.name {
        Some(n) => row.name = name_field("name", n)?,
        None if creating => return Err(ApiError::field("name", "name is required")),
        None => {}
    }
    if let Some(p) = input.price {
        (row.price_prompt, row.price_completion) = checked(
            "price",
            fields::price(p.prompt, p.completion, validate::Range::Console),
        )?;
    }
    if let Some(n) = input.max_output_tokens {
        row.max_output_tokens = n
            .map(|n| checked("max_output_tokens", fields::max_output_tokens(n)))
            .transpose()?;
    }
    if let Some(fallbacks) = input.fallbacks {
        let models: Vec<ModelRow> = state
            .store
            .rows_in(Table::Models, row.workspace_id)
            .await
            .map_err(store_error)?;
        let ups = upstreams(state, row.workspace_id).await?;
        checked("fallbacks", fields::fallbacks(&row.name, &fallbacks))?;
        for fb in &fallbacks {
            let known = models.iter().any(|m| m.name == *fb)
                || ups
                    .iter()
                    .any(|u| u.served_models().iter().any(|s| s.name == *fb));
            if !known {
                return Err(ApiError::field(
                    "fallbacks",
                    format!("fallback model {fb:?} does not exist in this workspace"),
                ));
            }
        }
        row.fallbacks = serde_json::to_string(&fallbacks).map_err(|_| ApiError::Internal)?;
    }
    Ok(())
}

/// `POST /admin/v1/models`.
pub async fn create(
    State(state): State<AppState>,
    actor: Actor,
    Body(input): Body<ModelInput>,
) -> AdminResult {
    let mut row = ModelRow {
        id: 0,
        workspace_id: actor.workspace_id(),
        name: String::new(),
        fallbacks: "[]".into(),
        price_prompt: 0,
        price_completion: 0,
        created_at: state.clock.now_ms(),
        max_output_tokens: None,
    };
    apply(&state, &mut row, input, true).await?;
    row.id = state.store.save_model(&row).await.map_err(store_error)?;
    config_changed(&state).await?;
    let body = model_json(&state, &row, &upstreams(&state, row.workspace_id).await?);
    audit(
        &state,
        &actor,
        "create",
        "model",
        row.id,
        None,
        Some(body.clone()),
    )
    .await;
    Ok(created(body))
}

/// `PATCH /admin/v1/models/{id}`.
pub async fn update(
    State(state): State<AppState>,
    actor: Actor,
    Id(id): Id,
    Body(input): Body<ModelInput>,
) -> AdminResult {
    let before = model_in(&state, &actor, id).await?;
    let mut row = before.clone();
    apply(&state, &mut row, input, false).await?;
    state.store.save_model(&row).await.map_err(store_error)?;
    config_changed(&state).await?;
    let ups = upstreams(&state, row.workspace_id).await?;
    let after = model_json(&state, &row, &ups);
    audit(
        &state,
        &actor,
        "update",
        "model",
        id,
        Some(model_json(&state, &before, &ups)),
        Some(after.clone()),
    )
    .await;
    Ok(Json(after).into_response())
}

/// `DELETE /admin/v1/models/{id}`: the name stays routable while a credential serves it (at
/// price 0, without fallbacks).
pub async fn delete(State(state): State<AppState>, actor: Actor, Id(id): Id) -> AdminResult {
    let before = model_in(&state, &actor, id).await?;
    let ups = upstreams(&state, actor.workspace_id()).await?;
    state
        .store
        .delete_in(Table::Models, actor.workspace_id(), id)
        .await
        .map_err(store_error)?;
    config_changed(&state).await?;
    audit(
        &state,
        &actor,
        "delete",
        "model",
        id,
        Some(model_json(&state, &before, &ups)),
        None,
    )
    .await;
    Ok(no_content())
}
